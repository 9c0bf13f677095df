# Command lines of the training-side tools (tests/cli/test_cli_flags.py): --version prints the
# MegaC version (and the checkpoint format where the tool reads checkpoints), --help lists
# every option of the tool's getopt_long table and every option README.md and docs/*.md use
# with that tool, and `--opt value` equals `--opt=value`.
if(TARGET mctrain AND TARGET mceval AND TARGET mcdata AND TARGET mcaudit AND TARGET mcplan)
  add_test(NAME cli.flags COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/test_cli_flags.py)
  set_tests_properties(cli.flags PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}" TIMEOUT 60)
endif()
