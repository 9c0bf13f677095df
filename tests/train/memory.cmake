# test_memory compares the trainer's arenas with mcplan's prediction, so it also links the
# planner. train.memreport (tests/train/memreport.sh): mctrain prints the step-1 memory
# table with every category and writes the same figures to its metrics log.
if(TARGET test_memory AND TARGET mc_plan)
  target_link_libraries(test_memory PRIVATE mc_plan)
endif()
