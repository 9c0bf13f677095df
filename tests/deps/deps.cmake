# Module layering: the #include graph and the offline tools' link lines against the table at
# the top of tests/deps/check_deps.py (`python3 tests/deps/check_deps.py --print`).
# deps.layering checks this tree; deps.layering_selftest runs the checker on synthetic trees.
find_program(MC_PYTHON3 python3)
if(MC_PYTHON3)
  add_test(NAME deps.layering
           COMMAND ${MC_PYTHON3} ${MC_SOURCE_DIR}/tests/deps/check_deps.py
                   --source ${MC_SOURCE_DIR} --build ${CMAKE_BINARY_DIR})
  add_test(NAME deps.layering_selftest
           COMMAND ${MC_PYTHON3} ${MC_SOURCE_DIR}/tests/deps/test_check_deps.py)
  set_tests_properties(deps.layering deps.layering_selftest PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()
