# reshard.ownmap_svg (tests/reshard/test_ownmap_svg.py): mcaudit --map of checkpoints in several
# layouts (stages of one rank, TP x DP x PP, EP, a wide world), parsed as SVG: no two labels
# overlap, no label overlaps a cell, everything lies inside the picture, and the rank columns
# fill the width right of the family names.
if(TARGET mcreshard AND TARGET mcaudit AND TARGET bench_reshard)
  add_test(NAME reshard.ownmap_svg
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/test_ownmap_svg.py
                   $<TARGET_FILE:mcreshard> $<TARGET_FILE:mcaudit> $<TARGET_FILE:bench_reshard>)
  set_tests_properties(reshard.ownmap_svg PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}" TIMEOUT 120)
endif()
