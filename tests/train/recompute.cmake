# test_recompute (tests/train/test_recompute.c) compares the trainer's activations arena with
# mcplan's activation figure under each train.recompute policy, so it also links the planner.
if(TARGET test_recompute AND TARGET mc_plan)
  target_link_libraries(test_recompute PRIVATE mc_plan)
endif()
