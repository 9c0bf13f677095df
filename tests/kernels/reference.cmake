# The network's forward against an independent float64 numpy implementation of docs/design.md
# section 2 (reference_model.py reads what model_dump writes).
if(TARGET mc_train)
  add_executable(model_dump ${CMAKE_CURRENT_LIST_DIR}/model_dump.c)
  target_compile_options(model_dump PRIVATE ${MC_WARNINGS})
  target_link_libraries(model_dump PRIVATE mc_train)
  add_test(NAME kernels.reference_model
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/reference_model.py $<TARGET_FILE:model_dump>)
  set_tests_properties(kernels.reference_model PROPERTIES TIMEOUT 60)
endif()
