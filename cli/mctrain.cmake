set(MC_TOOL_LINK mc_train)
# tests/dist (the mpirun tests of train/dist_*, registered by tests/dist/dist.cmake) has no
# library of its own; the test loop of tests/CMakeLists.txt includes a module's *.cmake only
# where a target mc_<module> exists, so this names the library those tests link.
if(NOT TARGET mc_dist)
  add_library(mc_dist INTERFACE)
  target_link_libraries(mc_dist INTERFACE mc_train)
endif()
