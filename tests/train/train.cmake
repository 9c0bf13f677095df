# End-to-end tests of the training tools (tests/train/e2e.sh MODE): a short run learns, bit-exact
# resume (also from a checkpoint resharded by mcreshard), mceval agrees with the trainer under
# any checkpoint layout, bad input gives clear errors.
if(TARGET mctrain AND TARGET mceval AND TARGET mcdata AND TARGET mcreshard)
  foreach(mode learn resume eval errors)
    add_test(NAME train.e2e_${mode} COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/e2e.sh ${mode})
    set_tests_properties(train.e2e_${mode} PROPERTIES
      ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR};OMP_NUM_THREADS=2"
      TIMEOUT 120)
  endforeach()
endif()
