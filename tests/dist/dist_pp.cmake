# Pipeline-parallel training (train/pipeline.c, 1F1B) under oversubscribed mpirun: 10 steps
# against the single-rank run, losses and gradient norms to 1e-4 relative, final weights
# (tests/dist/dist_train.c with --pp N --split S [--pattern P]). Uses dist.cmake's helpers.
if(COMMAND mc_dist_test AND TARGET dist_train)
  mc_dist_test(dist.pp2 2 $<TARGET_FILE:dist_train> 1 1 0 0 --pp 2 --split equal)
  # explicit splits: both stages hold E blocks; the last stage holds none (AME|R), the first none (A|MER)
  mc_dist_test(dist.pp2_explicit 2 $<TARGET_FILE:dist_train> 1 1 0 0 --pp 2 --split AEMR|AEMR)
  mc_dist_test(dist.pp2_explicit_last_no_e 2 $<TARGET_FILE:dist_train> 1 1 0 0 --pp 2 --split AME|R)
  mc_dist_test(dist.pp2_explicit_first_no_e 2 $<TARGET_FILE:dist_train> 1 1 0 0 --pp 2 --split AMR|EEE)
  mc_dist_test(dist.pp2_weighted 2 $<TARGET_FILE:dist_train> 1 1 0 0 --pp 2 --split weighted)
  mc_dist_test(dist.pp2_tp2 4 $<TARGET_FILE:dist_train> 2 1 0 0 --pp 2 --split equal)
  mc_dist_test(dist.pp2_tp2_sp 4 $<TARGET_FILE:dist_train> 2 1 1 0 --pp 2 --split equal)
  mc_dist_test(dist.pp2_dp2_zero1 4 $<TARGET_FILE:dist_train> 1 2 0 1 --pp 2 --split equal)
  mc_dist_test(dist.pp2_dp2_zero3 4 $<TARGET_FILE:dist_train> 1 2 0 3 --pp 2 --split equal)
  mc_dist_test(dist.pp4 4 $<TARGET_FILE:dist_train> 1 1 0 0 --pp 4 --split equal --pattern AMERAEMR)
  # Pipeline with expert parallelism (train/dist_ep.c keeps one EP route per E layer and
  # micro-batch slot in flight): both stages hold E blocks, then splits where one stage has none
  mc_dist_test(dist.pp2_dp2_ep2_zero0 4 $<TARGET_FILE:dist_train> 1 2 0 0 --ep 2 --pp 2 --split AEMR|AEMR)
  mc_dist_test(dist.pp2_dp2_ep2_zero1 4 $<TARGET_FILE:dist_train> 1 2 0 1 --ep 2 --pp 2 --split equal --pattern AEMRAEMR)
  mc_dist_test(dist.pp2_tp2_dp2_sp_ep2_zero1 8 $<TARGET_FILE:dist_train> 2 2 1 1 --ep 2 --pp 2 --split AEMR|AEMR)
  mc_dist_test(dist.pp2_dp2_ep2_first_no_e 4 $<TARGET_FILE:dist_train> 1 2 0 0 --ep 2 --pp 2 --split AMR|EEE)
  mc_dist_test(dist.pp2_dp2_ep2_last_no_e 4 $<TARGET_FILE:dist_train> 1 2 0 1 --ep 2 --pp 2 --split AME|R)
  # ZeRO 3 with pp x ep: each stage gathers its layers' weights over the DP group (dense) and
  # the expert-DP group (experts) while two micro-batches are in flight on stage 0
  mc_dist_test(dist.pp2_dp2_ep2_zero3 4 $<TARGET_FILE:dist_train> 1 2 0 3 --ep 2 --pp 2 --split AEMR|AEMR)

  # Save under pp2 (explicit AME|R) at step 5; resume as one rank and under another split.
  set(MC_DIST_PP_CKPT ${CMAKE_BINARY_DIR}/dist-pp-ckpt)
  add_test(NAME dist.pp_ckpt_clean COMMAND ${CMAKE_COMMAND} -E rm -rf ${MC_DIST_PP_CKPT})
  set_tests_properties(dist.pp_ckpt_clean PROPERTIES FIXTURES_SETUP dist_pp_ckpt_clean)
  mc_dist_test(dist.pp_ckpt_save_pp2 2 $<TARGET_FILE:dist_train> 1 1 0 0 --pp 2 --split AME|R --save ${MC_DIST_PP_CKPT})
  set_tests_properties(dist.pp_ckpt_save_pp2 PROPERTIES FIXTURES_REQUIRED dist_pp_ckpt_clean FIXTURES_SETUP dist_pp_ckpt)
  mc_dist_test(dist.pp_ckpt_resume_1rank 1 $<TARGET_FILE:dist_train> 1 1 0 0 --pp 1 --split equal --resume ${MC_DIST_PP_CKPT})
  mc_dist_test(dist.pp_ckpt_resume_pp2_split 2 $<TARGET_FILE:dist_train> 1 1 0 0 --pp 2 --split A|MER --resume ${MC_DIST_PP_CKPT})
  mc_dist_test(dist.pp_ckpt_resume_pp2_dp2_zero1 4 $<TARGET_FILE:dist_train> 1 2 0 1 --pp 2 --split equal --resume ${MC_DIST_PP_CKPT})
  set_tests_properties(dist.pp_ckpt_resume_1rank dist.pp_ckpt_resume_pp2_split dist.pp_ckpt_resume_pp2_dp2_zero1
                       PROPERTIES FIXTURES_REQUIRED dist_pp_ckpt)
endif()

# mctrain itself at pp=2 under mpirun: equal to one process, checkpoint resumed at pp=1 and
# under another split (tests/dist/mctrain_mpi.sh pp)
if(COMMAND mc_dist_test AND TARGET mctrain AND TARGET mcdata AND MC_DIST_MPIRUN)
  add_test(NAME dist.mctrain_pp COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/mctrain_mpi.sh pp)
  set_tests_properties(dist.mctrain_pp PROPERTIES ENVIRONMENT "${MC_DIST_ENV};MC_MPIRUN=${MC_DIST_MPIRUN}" TIMEOUT 240)
endif()
