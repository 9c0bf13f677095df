# docs/kernels.md's map of every op to its CPU and CUDA source file, checked against the code.
add_test(NAME kernels.kernel_map COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/kernel_map.py)
set_tests_properties(kernels.kernel_map PROPERTIES ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR}")
