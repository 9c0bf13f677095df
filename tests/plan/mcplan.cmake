# mcplan command-line tests: exit codes, messages and --json output (tests/plan/mcplan_cli.sh).
if(TARGET mcplan)
  add_test(NAME plan.mcplan_cli
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/mcplan_cli.sh $<TARGET_FILE:mcplan>)
  set_tests_properties(plan.mcplan_cli PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()
