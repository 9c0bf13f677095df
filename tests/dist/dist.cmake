# Distributed training tests under oversubscribed mpirun (tests/dist/*.c link mc_train).
find_program(MC_DIST_MPIRUN NAMES mpirun mpiexec)
if(MC_DIST_MPIRUN AND TARGET mc_train)
  set(MC_DIST_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
  function(mc_dist_exe name)
    add_executable(${name} ${CMAKE_CURRENT_LIST_DIR}/${name}.c)
    target_compile_options(${name} PRIVATE ${MC_WARNINGS})
    target_link_libraries(${name} PRIVATE mc_train)
  endfunction()
  function(mc_dist_test name np)
    add_test(NAME ${name} COMMAND ${MC_DIST_MPIRUN} --oversubscribe -np ${np} ${ARGN}
             WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${MC_DIST_ENV}" TIMEOUT 120)
  endfunction()

  mc_dist_exe(dist_tp)
  mc_dist_test(dist.tp2_net 2 $<TARGET_FILE:dist_tp>)

  # 10 steps against the single-rank run: losses to 1e-4 relative, final weights (TP SP ZERO args)
  mc_dist_exe(dist_train)
  mc_dist_test(dist.dp2_zero0 2 $<TARGET_FILE:dist_train> 1 2 0 0)
  mc_dist_test(dist.dp2_zero1 2 $<TARGET_FILE:dist_train> 1 2 0 1)
  mc_dist_test(dist.dp2_zero3 2 $<TARGET_FILE:dist_train> 1 2 0 3)
  mc_dist_test(dist.tp2 2 $<TARGET_FILE:dist_train> 2 1 0 0)
  mc_dist_test(dist.tp2_sp 2 $<TARGET_FILE:dist_train> 2 1 1 0)
  mc_dist_test(dist.tp2_dp2 4 $<TARGET_FILE:dist_train> 2 2 0 1)
  mc_dist_test(dist.tp2_dp2_zero3 4 $<TARGET_FILE:dist_train> 2 2 0 3)
  mc_dist_test(dist.tp2_sp_dp2_zero3 4 $<TARGET_FILE:dist_train> 2 2 1 3)

  # Expert parallelism (train/dist_ep.c): the same comparison with the experts sharded over
  # EP groups and the routed rows moved by all-to-all; an expert receiving no row (E=8 top-1,
  # one sequence per micro-batch); the capacity path, on the shard and on gathered sequences.
  mc_dist_test(dist.dp2_ep2_zero0 2 $<TARGET_FILE:dist_train> 1 2 0 0 --ep 2)
  mc_dist_test(dist.dp2_ep2_zero1 2 $<TARGET_FILE:dist_train> 1 2 0 1 --ep 2)
  mc_dist_test(dist.dp4_ep2 4 $<TARGET_FILE:dist_train> 1 4 0 0 --ep 2)
  mc_dist_test(dist.dp4_ep2_zero3 4 $<TARGET_FILE:dist_train> 1 4 0 3 --ep 2)
  mc_dist_test(dist.dp4_ep4_zero1 4 $<TARGET_FILE:dist_train> 1 4 0 1 --ep 4)
  mc_dist_test(dist.tp2_sp_ep2 2 $<TARGET_FILE:dist_train> 2 1 1 0 --ep 2)
  mc_dist_test(dist.tp2_dp2_sp_ep2_zero1 4 $<TARGET_FILE:dist_train> 2 2 1 1 --ep 2)
  mc_dist_test(dist.dp2_ep2_empty_expert 2 $<TARGET_FILE:dist_train> 1 2 0 0 --ep 2 --moe 8 1 0 --mb 1 --empty)
  mc_dist_test(dist.dp2_ep2_capacity 2 $<TARGET_FILE:dist_train> 1 2 0 1 --ep 2 --moe 4 2 1.0)
  mc_dist_test(dist.tp2_sp_ep2_capacity 2 $<TARGET_FILE:dist_train> 2 1 1 0 --ep 2 --moe 4 2 1.0)

  # Save under tp2 x dp2 zero 1 at step 5; resume as one rank, as dp4 zero 3 and as tp2 + sp.
  set(MC_DIST_CKPT ${CMAKE_BINARY_DIR}/dist-ckpt)
  add_test(NAME dist.ckpt_clean COMMAND ${CMAKE_COMMAND} -E rm -rf ${MC_DIST_CKPT})
  set_tests_properties(dist.ckpt_clean PROPERTIES FIXTURES_SETUP dist_ckpt_clean)
  mc_dist_test(dist.ckpt_save_tp2_dp2_zero1 4 $<TARGET_FILE:dist_train> 2 2 0 1 --save ${MC_DIST_CKPT})
  set_tests_properties(dist.ckpt_save_tp2_dp2_zero1 PROPERTIES FIXTURES_REQUIRED dist_ckpt_clean FIXTURES_SETUP dist_ckpt)
  mc_dist_test(dist.ckpt_resume_1rank 1 $<TARGET_FILE:dist_train> 1 1 0 0 --resume ${MC_DIST_CKPT})
  mc_dist_test(dist.ckpt_resume_dp4_zero3 4 $<TARGET_FILE:dist_train> 1 4 0 3 --resume ${MC_DIST_CKPT})
  mc_dist_test(dist.ckpt_resume_tp2_sp 2 $<TARGET_FILE:dist_train> 2 1 1 0 --resume ${MC_DIST_CKPT})
  set_tests_properties(dist.ckpt_resume_1rank dist.ckpt_resume_dp4_zero3 dist.ckpt_resume_tp2_sp
                       PROPERTIES FIXTURES_REQUIRED dist_ckpt)

  # The other path after a hardware change: mcreshard the tp2 x dp2 checkpoint offline to
  # pp2 x tp2 (another world, stage split and ZeRO group), then resume there; steps 6..10 must
  # continue the uninterrupted run's losses (losses.txt travels with the checkpoint).
  if(TARGET mcreshard)
    set(MC_DIST_CKPT_RS ${MC_DIST_CKPT}-pp2tp2)
    add_test(NAME dist.ckpt_mcreshard_pp2_tp2
             COMMAND sh -c "rm -rf '${MC_DIST_CKPT_RS}' && '$<TARGET_FILE:mcreshard>' '${MC_DIST_CKPT}' '${MC_DIST_CKPT_RS}' --tp 2 --dp 1 --pp 2 --zero 1 --no-progress && cp '${MC_DIST_CKPT}/losses.txt' '${MC_DIST_CKPT_RS}/'")
    set_tests_properties(dist.ckpt_mcreshard_pp2_tp2 PROPERTIES FIXTURES_REQUIRED dist_ckpt FIXTURES_SETUP dist_ckpt_rs)
    mc_dist_test(dist.ckpt_resume_resharded_pp2_tp2 4 $<TARGET_FILE:dist_train> 2 1 0 1 --pp 2 --resume ${MC_DIST_CKPT_RS})
    set_tests_properties(dist.ckpt_resume_resharded_pp2_tp2 PROPERTIES FIXTURES_REQUIRED dist_ckpt_rs)
  endif()

  # 16 ranks (oversubscribed): tp2 x dp4 x pp2 ZeRO 1 saves at step 5; resumed on 4 ranks
  # (dp4 ZeRO 3) by load-time resharding, and resharded offline to one rank, audited and
  # resumed there; every resume continues the uninterrupted run's losses.
  set(MC_DIST_CKPT16 ${CMAKE_BINARY_DIR}/dist-ckpt16)
  add_test(NAME dist.ckpt16_clean COMMAND ${CMAKE_COMMAND} -E rm -rf ${MC_DIST_CKPT16} ${MC_DIST_CKPT16}-1)
  set_tests_properties(dist.ckpt16_clean PROPERTIES FIXTURES_SETUP dist_ckpt16_clean)
  mc_dist_test(dist.ckpt16_save_tp2_dp4_pp2 16 $<TARGET_FILE:dist_train> 2 4 0 1 --pp 2 --save ${MC_DIST_CKPT16})
  set_tests_properties(dist.ckpt16_save_tp2_dp4_pp2 PROPERTIES FIXTURES_REQUIRED dist_ckpt16_clean FIXTURES_SETUP dist_ckpt16)
  mc_dist_test(dist.ckpt16_resume_dp4_zero3 4 $<TARGET_FILE:dist_train> 1 4 0 3 --resume ${MC_DIST_CKPT16})
  set_tests_properties(dist.ckpt16_resume_dp4_zero3 PROPERTIES FIXTURES_REQUIRED dist_ckpt16)
  if(TARGET mcreshard AND TARGET mcaudit)
    add_test(NAME dist.ckpt16_mcreshard_1rank
             COMMAND sh -c "'$<TARGET_FILE:mcaudit>' '${MC_DIST_CKPT16}' --verify --no-progress && '$<TARGET_FILE:mcreshard>' '${MC_DIST_CKPT16}' '${MC_DIST_CKPT16}-1' --consolidate --no-progress && '$<TARGET_FILE:mcaudit>' '${MC_DIST_CKPT16}-1' --verify --no-progress && cp '${MC_DIST_CKPT16}/losses.txt' '${MC_DIST_CKPT16}-1/'")
    set_tests_properties(dist.ckpt16_mcreshard_1rank PROPERTIES FIXTURES_REQUIRED dist_ckpt16 FIXTURES_SETUP dist_ckpt16_rs)
    mc_dist_test(dist.ckpt16_resume_resharded_1rank 1 $<TARGET_FILE:dist_train> 1 1 0 0 --resume ${MC_DIST_CKPT16}-1)
    set_tests_properties(dist.ckpt16_resume_resharded_1rank PROPERTIES FIXTURES_REQUIRED dist_ckpt16_rs)
  endif()

  # mctrain itself under mpirun (tests/dist/mctrain_mpi.sh MODE)
  if(TARGET mctrain AND TARGET mcdata)
    foreach(mode equal resume stop kill stall errors async)
      add_test(NAME dist.mctrain_${mode} COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/mctrain_mpi.sh ${mode})
      set_tests_properties(dist.mctrain_${mode} PROPERTIES ENVIRONMENT "${MC_DIST_ENV};MC_MPIRUN=${MC_DIST_MPIRUN}" TIMEOUT 180)
    endforeach()
  endif()
endif()
