# The CLI end-to-end test: mcreshard, mcaudit and bench_reshard (its --synth --tiny makes
# the source checkpoint), checked with h5py/numpy/hashlib/jsonschema from Debian's python.
if(TARGET mcreshard AND TARGET mcaudit AND TARGET bench_reshard)
  add_test(NAME reshard.test_reshard_cli
           COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/reshard/test_reshard_cli.py
                   $<TARGET_FILE:mcreshard> $<TARGET_FILE:mcaudit> $<TARGET_FILE:bench_reshard>
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(reshard.test_reshard_cli PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()
