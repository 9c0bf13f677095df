# test_memory compares the trainer's arenas with mcplan's prediction, so it also links the
# planner. train.memreport (tests/train/memreport.sh): mctrain prints the step-1 memory
# table with every category and writes the same figures to its metrics log.
if(TARGET test_memory AND TARGET mc_plan)
  target_link_libraries(test_memory PRIVATE mc_plan)
endif()
if(TARGET mctrain AND TARGET mcdata AND TARGET mcplan)
  find_program(MC_MEMREPORT_MPIRUN NAMES mpirun mpiexec)
  add_test(NAME train.memreport COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/memreport.sh)
  set_tests_properties(train.memreport PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR};OMP_NUM_THREADS=2;MC_MPIRUN=${MC_MEMREPORT_MPIRUN}"
    TIMEOUT 120)
endif()
