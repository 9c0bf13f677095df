# Reshard and audit memory against the number of rank files (16 vs 256), each run a fresh
# process measured by os.wait4 (tests/reshard/test_reshard_files_memory.py).
if(TARGET mcreshard AND TARGET mcaudit AND TARGET bench_reshard)
  add_test(NAME reshard.files_memory
           COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/reshard/test_reshard_files_memory.py
                   $<TARGET_FILE:mcreshard> $<TARGET_FILE:mcaudit> $<TARGET_FILE:bench_reshard>)
  set_tests_properties(reshard.files_memory PROPERTIES TIMEOUT 300)
endif()
