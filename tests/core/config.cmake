# Configuration schema agreement: configs/*.json and the good cases validate against
# schemas/config.schema.json, the bad cases are rejected by it where it can express the rule,
# and probes of every key's edges get the same verdict from the schema and the C parser.
add_test(NAME core.config_schema
         COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/core/config_cases/check_schema.py $<TARGET_FILE:test_config>)
set_tests_properties(core.config_schema PROPERTIES
  ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
