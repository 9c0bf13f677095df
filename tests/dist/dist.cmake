# Distributed training tests under oversubscribed mpirun (tests/dist/*.c link mc_train).
find_program(MC_DIST_MPIRUN NAMES mpirun mpiexec)
if(MC_DIST_MPIRUN AND TARGET mc_train)
  set(MC_DIST_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
  function(mc_dist_exe name)
    add_executable(${name} ${CMAKE_CURRENT_LIST_DIR}/${name}.c)
    target_compile_options(${name} PRIVATE ${MC_WARNINGS})
    target_link_libraries(${name} PRIVATE mc_train)
  endfunction()
  function(mc_dist_test name np)
    add_test(NAME ${name} COMMAND ${MC_DIST_MPIRUN} --oversubscribe -np ${np} ${ARGN}
             WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${MC_DIST_ENV}" TIMEOUT 120)
  endfunction()

  mc_dist_exe(dist_tp)
  mc_dist_test(dist.tp2_net 2 $<TARGET_FILE:dist_tp>)
endif()
