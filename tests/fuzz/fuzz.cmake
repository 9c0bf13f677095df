# libFuzzer harnesses (-DMC_FUZZ=ON with clang; scripts/fuzz.sh). Each harness has a committed
# seed corpus in tests/fuzz/corpus/<name>/ (crashes found are kept there as regression inputs)
# and two tests: fuzz.<name>.replay runs every corpus input once; fuzz.<name>.run runs a fixed
# number of new inputs from a fixed seed (deterministic, so the suite never fails at random).
if(MC_FUZZ)
  set(MC_FUZZ_RUNS 3000 CACHE STRING "inputs per harness in fuzz.<name>.run")
  set(MC_FUZZ_LIBS_config mc_core)
  set(MC_FUZZ_LIBS_manifest mc_ckpt)
  set(MC_FUZZ_LIBS_latest mc_ckpt)
  set(MC_FUZZ_LIBS_rankfile mc_ckpt)
  set(MC_FUZZ_LIBS_safetensors mc_reshard)
  # fuzz_rankfile starts from a small checkpoint made by mctrain (a test fixture).
  add_test(NAME fuzz.make_ckpt COMMAND ${MC_SOURCE_DIR}/tests/fuzz/make_ckpt.sh ${CMAKE_BINARY_DIR}
                                       ${CMAKE_CURRENT_BINARY_DIR}/fuzz-ckpt)
  set_tests_properties(fuzz.make_ckpt PROPERTIES FIXTURES_SETUP mc_fuzz_ckpt ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
  foreach(h config manifest latest rankfile safetensors)
    add_executable(fuzz_${h} ${MC_SOURCE_DIR}/tests/fuzz/fuzz_${h}.c)
    target_compile_options(fuzz_${h} PRIVATE ${MC_WARNINGS})
    target_link_options(fuzz_${h} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(fuzz_${h} PRIVATE ${MC_FUZZ_LIBS_${h}})
    set(corpus ${MC_SOURCE_DIR}/tests/fuzz/corpus/${h})
    set(fresh ${CMAKE_CURRENT_BINARY_DIR}/fuzz-new/${h})
    file(MAKE_DIRECTORY ${fresh})
    add_test(NAME fuzz.${h}.replay COMMAND fuzz_${h} -runs=0 ${corpus})
    add_test(NAME fuzz.${h}.run COMMAND fuzz_${h} -seed=1 -runs=${MC_FUZZ_RUNS} -max_len=65536 -timeout=20
                                        ${fresh} ${corpus})
    set_tests_properties(fuzz.${h}.replay fuzz.${h}.run PROPERTIES
      ENVIRONMENT "MC_FUZZ_CKPT=${CMAKE_CURRENT_BINARY_DIR}/fuzz-ckpt/step;ASAN_OPTIONS=detect_leaks=1"
      FIXTURES_REQUIRED mc_fuzz_ckpt TIMEOUT 900)
  endforeach()
endif()
