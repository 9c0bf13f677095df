# Reliability and security tests (docs/reliability.md): untrusted checkpoints against every
# reader, checked with h5py/numpy from Debian's python.
if(TARGET mcreshard AND TARGET mcaudit AND TARGET mctrain AND TARGET mceval AND TARGET mcdata)
  foreach(mode storage flips)
    add_test(NAME reliability.untrusted_${mode}
             COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/reliability/test_untrusted.py ${mode} 20
             WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
    set_tests_properties(reliability.untrusted_${mode} PROPERTIES
      ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
  endforeach()
endif()
if(TARGET mcreshard AND TARGET mcaudit AND TARGET mctrain AND TARGET mceval AND TARGET mcdata)
  add_test(NAME reliability.paths_locks
           COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/reliability/test_paths.py
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(reliability.paths_locks PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()
# The full-disk shim (LD_PRELOAD) and the test that uses it.
add_library(mc_enospc_shim MODULE ${MC_SOURCE_DIR}/tests/reliability/enospc_shim.c)
# never instrumented: it is preloaded ahead of the sanitizer runtimes of an MC_SANITIZE build
target_compile_options(mc_enospc_shim PRIVATE ${MC_WARNINGS} -fno-sanitize=all)
target_link_options(mc_enospc_shim PRIVATE -fno-sanitize=all)
target_link_libraries(mc_enospc_shim PRIVATE ${CMAKE_DL_LIBS})
if(TARGET mcreshard AND TARGET mcaudit AND TARGET mctrain)
  add_test(NAME reliability.full_disk
           COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/reliability/test_full_disk.py $<TARGET_FILE:mc_enospc_shim>
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(reliability.full_disk PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()
if(TARGET mctrain AND TARGET mcaudit AND TARGET mcdata)
  add_test(NAME reliability.kill_loop
           COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/reliability/test_kill_loop.py 20
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(reliability.kill_loop PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}" TIMEOUT 600)
endif()
# Checked arithmetic: configurations and token files whose sizes overflow (issue 17 item 9).
if(TARGET mctrain AND TARGET mcplan)
  add_test(NAME reliability.overflow
           COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/reliability/test_overflow.py
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(reliability.overflow PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()
