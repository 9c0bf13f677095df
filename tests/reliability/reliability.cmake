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
