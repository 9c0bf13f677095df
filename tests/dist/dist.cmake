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

  # ZeRO 0/1's chunked step collectives against one job over every parameter, bit for bit
  mc_dist_exe(dist_chunks)
  mc_dist_test(dist.chunks 2 $<TARGET_FILE:dist_chunks>)

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
  # ZeRO 0/1 reducing each layer's gradients as its backward ends in a step's last
  # micro-batch, against reducing them all after it: bit for bit, in groups of two members
  # (dp, expert-DP, with TP's partial sums first), fp32 and bf16.
  mc_dist_test(dist.late_reduce_dp2_zero0 2 $<TARGET_FILE:dist_train> 1 2 0 0 --late-reduce)
  mc_dist_test(dist.late_reduce_dp2_zero1 2 $<TARGET_FILE:dist_train> 1 2 0 1 --late-reduce)
  mc_dist_test(dist.late_reduce_dp2_zero1_bf16 2 $<TARGET_FILE:dist_train> 1 2 0 1 --bf16 --late-reduce)
  mc_dist_test(dist.late_reduce_tp2_sp_dp2_zero1 4 $<TARGET_FILE:dist_train> 2 2 1 1 --late-reduce)
  mc_dist_test(dist.late_reduce_dp2_ep2_zero1 2 $<TARGET_FILE:dist_train> 1 2 0 1 --ep 2 --late-reduce)
  mc_dist_test(dist.late_reduce_tp2_sp_dp2_ep2_zero0 4 $<TARGET_FILE:dist_train> 2 2 1 0 --ep 2 --late-reduce)
  # Activation recomputation (train.recompute, train/net.c): each layout run under none and
  # under selective or full: losses, gradient norms and final master weights bitwise equal,
  # every rank's activations arena equal to mcplan's figure (dist_train --recompute P).
  foreach(pol selective full)
    mc_dist_test(dist.recompute_tp2_${pol} 2 $<TARGET_FILE:dist_train> 2 1 0 0 --recompute ${pol})
    mc_dist_test(dist.recompute_tp2_sp_${pol} 2 $<TARGET_FILE:dist_train> 2 1 1 0 --recompute ${pol})
    mc_dist_test(dist.recompute_pp2_${pol} 2 $<TARGET_FILE:dist_train> 1 1 0 0 --pp 2 --split equal --recompute ${pol})
    mc_dist_test(dist.recompute_dp2_zero3_${pol} 2 $<TARGET_FILE:dist_train> 1 2 0 3 --recompute ${pol})
    mc_dist_test(dist.recompute_dp2_ep2_${pol} 2 $<TARGET_FILE:dist_train> 1 2 0 0 --ep 2 --recompute ${pol})
    mc_dist_test(dist.recompute_tp2_sp_ep2_capacity_${pol} 2 $<TARGET_FILE:dist_train> 2 1 1 0 --ep 2 --moe 4 2 1.0 --recompute ${pol})
    mc_dist_test(dist.recompute_pp2_dp2_ep2_zero3_${pol} 4 $<TARGET_FILE:dist_train> 1 2 0 3 --ep 2 --pp 2 --split AEMR|AEMR --recompute ${pol})
  endforeach()
  # full under ep > 1 keeps one set of received expert rows for all E layers (here three)
  mc_dist_test(dist.recompute_dp2_ep2_three_e_full 2 $<TARGET_FILE:dist_train> 1 2 0 1 --ep 2 --pattern AEMEREAE --recompute full)

  # Fewer local experts than expert-DP members: the balanced-v2 rule splits the experts' ZeRO
  # parts on dim 1 (one expert, part of its rows, per member): ZeRO 3 over dp4 with E=2, and
  # tp2 x dp2 + sp ep2 ZeRO 1 with E=2 (one expert per EP rank, groups of 2).
  mc_dist_test(dist.dp4_zero3_experts_dim1 4 $<TARGET_FILE:dist_train> 1 4 0 3 --moe 2 1 0)
  mc_dist_test(dist.tp2_dp2_sp_ep2_zero1_experts_dim1 4 $<TARGET_FILE:dist_train> 2 2 1 1 --ep 2 --moe 2 1 0)

  # Muon groups (optim.groups=muon:matrices,adamw:all, train/optim.c): the whole-matrix gathers
  # over TP (row and column splits, with SP), over the ZeRO group (zero 1 and 3) and both, and
  # pipeline stages, against the single-rank Muon run; a Muon checkpoint saved under tp2 x dp2
  # zero 1 resumed as one rank and as pp2 x dp2 x ep2 zero 3 (its momentum resharded at load).
  set(MC_MUON --groups muon:matrices,adamw:all)
  mc_dist_test(dist.muon_tp2 2 $<TARGET_FILE:dist_train> 2 1 0 0 ${MC_MUON})
  mc_dist_test(dist.muon_dp2_zero1 2 $<TARGET_FILE:dist_train> 1 2 0 1 ${MC_MUON})
  mc_dist_test(dist.muon_tp2_sp_dp2_zero3 4 $<TARGET_FILE:dist_train> 2 2 1 3 ${MC_MUON})
  mc_dist_test(dist.muon_pp2_dp2_ep2_zero1 4 $<TARGET_FILE:dist_train> 1 2 0 1 --ep 2 --pp 2 --split AE|MR ${MC_MUON})
  set(MC_DIST_CKPT_MUON ${CMAKE_BINARY_DIR}/dist-ckpt-muon)
  add_test(NAME dist.muon_ckpt_clean COMMAND ${CMAKE_COMMAND} -E rm -rf ${MC_DIST_CKPT_MUON})
  set_tests_properties(dist.muon_ckpt_clean PROPERTIES FIXTURES_SETUP dist_muon_ckpt_clean)
  mc_dist_test(dist.muon_ckpt_save_tp2_dp2_zero1 4 $<TARGET_FILE:dist_train> 2 2 0 1 ${MC_MUON} --save ${MC_DIST_CKPT_MUON})
  set_tests_properties(dist.muon_ckpt_save_tp2_dp2_zero1 PROPERTIES FIXTURES_REQUIRED dist_muon_ckpt_clean FIXTURES_SETUP dist_muon_ckpt)
  mc_dist_test(dist.muon_ckpt_resume_1rank 1 $<TARGET_FILE:dist_train> 1 1 0 0 ${MC_MUON} --resume ${MC_DIST_CKPT_MUON})
  mc_dist_test(dist.muon_ckpt_resume_pp2_dp2_ep2_zero3 4 $<TARGET_FILE:dist_train> 1 2 0 3 --ep 2 --pp 2 --split AM|ER ${MC_MUON} --resume ${MC_DIST_CKPT_MUON})
  set_tests_properties(dist.muon_ckpt_resume_1rank dist.muon_ckpt_resume_pp2_dp2_ep2_zero3 PROPERTIES FIXTURES_REQUIRED dist_muon_ckpt)

  # bf16 weights (train.dtype=bf16) on the CPU's bf16 instance, against the single-rank bf16
  # run: ZeRO 1 and ZeRO 3 (fp32 master shards, each gather rounded to bf16), with pipeline
  # stages and with Muon; a bf16 ZeRO 3 checkpoint resumed as one rank and as pp2 x dp2 ZeRO 1;
  # expert parallelism, whose exchanged expert rows are bf16 as one rank's are (dp2 x ep2 at
  # ZeRO 1 and 3: bitwise equal losses observed; pp2 x dp2 x ep2 within 7e-6). Not TP: under
  # TP the product activations stay fp32 (dist_train refuses --bf16 with tp > 1).
  mc_dist_test(dist.bf16_dp2_zero1 2 $<TARGET_FILE:dist_train> 1 2 0 1 --bf16)
  mc_dist_test(dist.bf16_dp2_ep2_zero1 2 $<TARGET_FILE:dist_train> 1 2 0 1 --ep 2 --bf16)
  mc_dist_test(dist.bf16_dp2_ep2_zero3 2 $<TARGET_FILE:dist_train> 1 2 0 3 --ep 2 --bf16)
  mc_dist_test(dist.bf16_pp2_dp2_ep2_zero1 4 $<TARGET_FILE:dist_train> 1 2 0 1 --ep 2 --pp 2 --split AE|MR --bf16)
  mc_dist_test(dist.bf16_dp2_zero3 2 $<TARGET_FILE:dist_train> 1 2 0 3 --bf16)
  mc_dist_test(dist.bf16_pp2_dp2_zero3 4 $<TARGET_FILE:dist_train> 1 2 0 3 --pp 2 --split AE|MR --bf16)
  mc_dist_test(dist.bf16_muon_dp2_zero3 2 $<TARGET_FILE:dist_train> 1 2 0 3 --bf16 ${MC_MUON})
  set(MC_DIST_CKPT_BF16 ${CMAKE_BINARY_DIR}/dist-ckpt-bf16)
  add_test(NAME dist.bf16_ckpt_clean COMMAND ${CMAKE_COMMAND} -E rm -rf ${MC_DIST_CKPT_BF16})
  set_tests_properties(dist.bf16_ckpt_clean PROPERTIES FIXTURES_SETUP dist_bf16_ckpt_clean)
  mc_dist_test(dist.bf16_ckpt_save_dp2_zero3 2 $<TARGET_FILE:dist_train> 1 2 0 3 --bf16 --save ${MC_DIST_CKPT_BF16})
  set_tests_properties(dist.bf16_ckpt_save_dp2_zero3 PROPERTIES FIXTURES_REQUIRED dist_bf16_ckpt_clean FIXTURES_SETUP dist_bf16_ckpt)
  mc_dist_test(dist.bf16_ckpt_resume_1rank 1 $<TARGET_FILE:dist_train> 1 1 0 0 --bf16 --resume ${MC_DIST_CKPT_BF16})
  mc_dist_test(dist.bf16_ckpt_resume_pp2_dp2_zero1 4 $<TARGET_FILE:dist_train> 1 2 0 1 --pp 2 --split AM|ER --bf16 --resume ${MC_DIST_CKPT_BF16})
  set_tests_properties(dist.bf16_ckpt_resume_1rank dist.bf16_ckpt_resume_pp2_dp2_zero1 PROPERTIES FIXTURES_REQUIRED dist_bf16_ckpt)

  # Save under tp2 x dp2 zero 1 at step 5; resume as one rank, as dp4 zero 3 and as tp2 + sp.
  set(MC_DIST_CKPT ${CMAKE_BINARY_DIR}/dist-ckpt)
  add_test(NAME dist.ckpt_clean COMMAND ${CMAKE_COMMAND} -E rm -rf ${MC_DIST_CKPT})
  set_tests_properties(dist.ckpt_clean PROPERTIES FIXTURES_SETUP dist_ckpt_clean)
  mc_dist_test(dist.ckpt_save_tp2_dp2_zero1 4 $<TARGET_FILE:dist_train> 2 2 0 1 --save ${MC_DIST_CKPT})
  set_tests_properties(dist.ckpt_save_tp2_dp2_zero1 PROPERTIES FIXTURES_REQUIRED dist_ckpt_clean FIXTURES_SETUP dist_ckpt)
  mc_dist_test(dist.ckpt_resume_1rank 1 $<TARGET_FILE:dist_train> 1 1 0 0 --resume ${MC_DIST_CKPT})
  mc_dist_test(dist.ckpt_resume_dp4_zero3 4 $<TARGET_FILE:dist_train> 1 4 0 3 --resume ${MC_DIST_CKPT})
  mc_dist_test(dist.ckpt_resume_tp2_sp 2 $<TARGET_FILE:dist_train> 2 1 1 0 --resume ${MC_DIST_CKPT})
  # ... and directly into pipeline x expert parallelism (pp2 x dp2 x ep2: load-time resharding
  # into stages and expert shards, zero 1 and zero 3)
  mc_dist_test(dist.ckpt_resume_pp2_dp2_ep2 4 $<TARGET_FILE:dist_train> 1 2 0 1 --ep 2 --pp 2 --split AME|R --resume ${MC_DIST_CKPT})
  mc_dist_test(dist.ckpt_resume_pp2_dp2_ep2_zero3 4 $<TARGET_FILE:dist_train> 1 2 0 3 --ep 2 --pp 2 --split AM|ER --resume ${MC_DIST_CKPT})
  set_tests_properties(dist.ckpt_resume_1rank dist.ckpt_resume_dp4_zero3 dist.ckpt_resume_tp2_sp
                       dist.ckpt_resume_pp2_dp2_ep2 dist.ckpt_resume_pp2_dp2_ep2_zero3
                       PROPERTIES FIXTURES_REQUIRED dist_ckpt)

  # Loading once across the job (train/load_shared.c): every --resume above and below also
  # loads rank by rank and compares (bitwise states, bitwise losses, bytes read). Here the
  # cases where ranks share stored shards: dp2 zero 0 saves; resuming it as dp2 zero 0
  # (replicas), dp4 zero 0 and dp4 zero 1 (dp2 -> dp4), and the tp2 x dp2 zero 1 checkpoint
  # as dp4 zero 0 (tp2 -> tp1, dp2 -> dp4), must read each needed stored byte once in all,
  # where each rank reading its own boxes reads it once per rank (--replicas); a flipped bit
  # in a copy must fail the load on every rank alike.
  set(MC_DIST_CKPT_DP2 ${CMAKE_BINARY_DIR}/dist-ckpt-dp2)
  add_test(NAME dist.load_once_clean COMMAND ${CMAKE_COMMAND} -E rm -rf ${MC_DIST_CKPT_DP2} ${MC_DIST_CKPT_DP2}-bad
                                           ${MC_DIST_CKPT_DP2}-bad2)
  set_tests_properties(dist.load_once_clean PROPERTIES FIXTURES_SETUP dist_load_once_clean)
  mc_dist_test(dist.load_once_save_dp2_zero0 2 $<TARGET_FILE:dist_train> 1 2 0 0 --save ${MC_DIST_CKPT_DP2})
  set_tests_properties(dist.load_once_save_dp2_zero0 PROPERTIES FIXTURES_REQUIRED dist_load_once_clean FIXTURES_SETUP dist_load_once)
  mc_dist_test(dist.load_once_dp2_zero0 2 $<TARGET_FILE:dist_train> 1 2 0 0 --replicas 2 --resume ${MC_DIST_CKPT_DP2})
  mc_dist_test(dist.load_once_dp4_zero0 4 $<TARGET_FILE:dist_train> 1 4 0 0 --replicas 4 --resume ${MC_DIST_CKPT_DP2})
  mc_dist_test(dist.load_once_dp4_zero1 4 $<TARGET_FILE:dist_train> 1 4 0 1 --replicas 4 --resume ${MC_DIST_CKPT_DP2})
  add_test(NAME dist.load_once_corrupt
           COMMAND sh -c "rm -rf '${MC_DIST_CKPT_DP2}-bad' && cp -r '${MC_DIST_CKPT_DP2}' '${MC_DIST_CKPT_DP2}-bad' && '${MC_DIST_MPIRUN}' --oversubscribe -np 4 '$<TARGET_FILE:dist_train>' 1 4 0 1 --corrupt --resume '${MC_DIST_CKPT_DP2}-bad'"
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(dist.load_once_corrupt PROPERTIES ENVIRONMENT "${MC_DIST_ENV}" TIMEOUT 120)
  # The same with the files' digests stripped (tests/ckpt/ckpt_edit.py), so that no check
  # before parsing catches the flip of the last shard: its own hash fails in the last of many
  # rounds, on the thread that reads a round ahead of the exchange.
  add_test(NAME dist.load_once_corrupt_ahead
           COMMAND sh -c "rm -rf '${MC_DIST_CKPT_DP2}-bad2' && cp -r '${MC_DIST_CKPT_DP2}' '${MC_DIST_CKPT_DP2}-bad2' && /usr/bin/python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from ckpt_edit import strip_file_hashes; strip_file_hashes(sys.argv[2])' '${MC_SOURCE_DIR}/tests/ckpt' '${MC_DIST_CKPT_DP2}-bad2' && '${MC_DIST_MPIRUN}' --oversubscribe -np 4 '$<TARGET_FILE:dist_train>' 1 4 0 1 --round-bytes 1000 --corrupt-last --resume '${MC_DIST_CKPT_DP2}-bad2'"
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(dist.load_once_corrupt_ahead PROPERTIES ENVIRONMENT "${MC_DIST_ENV}" TIMEOUT 120)
  set_tests_properties(dist.load_once_dp2_zero0 dist.load_once_dp4_zero0 dist.load_once_dp4_zero1 dist.load_once_corrupt
                       dist.load_once_corrupt_ahead PROPERTIES FIXTURES_REQUIRED dist_load_once)
  mc_dist_test(dist.load_once_tp2dp2_to_dp4_zero0 4 $<TARGET_FILE:dist_train> 1 4 0 0 --replicas 4 --resume ${MC_DIST_CKPT})
  set_tests_properties(dist.load_once_tp2dp2_to_dp4_zero0 PROPERTIES FIXTURES_REQUIRED dist_ckpt)

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
    # offline to pp2 x dp2 x ep2 (experts split over EP, stage split AM|ER), then resumed there
    set(MC_DIST_CKPT_EP ${MC_DIST_CKPT}-pp2dp2ep2)
    add_test(NAME dist.ckpt_mcreshard_pp2_dp2_ep2
             COMMAND sh -c "rm -rf '${MC_DIST_CKPT_EP}' && '$<TARGET_FILE:mcreshard>' '${MC_DIST_CKPT}' '${MC_DIST_CKPT_EP}' --tp 1 --dp 2 --pp 2 --ep 2 --zero 1 --split 'AM|ER' --no-progress && cp '${MC_DIST_CKPT}/losses.txt' '${MC_DIST_CKPT_EP}/'")
    set_tests_properties(dist.ckpt_mcreshard_pp2_dp2_ep2 PROPERTIES FIXTURES_REQUIRED dist_ckpt FIXTURES_SETUP dist_ckpt_ep)
    mc_dist_test(dist.ckpt_resume_resharded_pp2_dp2_ep2 4 $<TARGET_FILE:dist_train> 1 2 0 1 --ep 2 --pp 2 --split AM|ER --resume ${MC_DIST_CKPT_EP})
    set_tests_properties(dist.ckpt_resume_resharded_pp2_dp2_ep2 PROPERTIES FIXTURES_REQUIRED dist_ckpt_ep)
  endif()

  # Issue 20's layout on 8 CPU ranks (its GPU runs wait for an 8-GPU machine; the training
  # itself against one rank is dist.pp2_tp2_dp2_sp_ep2_zero1, dist_pp.cmake): pp2 x tp2 x dp2
  # with sp and ep2, ZeRO 1, stages AE|MR, saves at step 5; resumed on 4 ranks (tp2 x dp2
  # ZeRO 3) and on 2 (pp2, stages AEM|R) by load-time resharding, and resharded offline by
  # mcreshard to dp2 x ep2 (audited before and after) and resumed there; every resume
  # continues the uninterrupted run's losses.
  set(MC_DIST_CKPT8 ${CMAKE_BINARY_DIR}/dist-ckpt8)
  add_test(NAME dist.ckpt8_clean COMMAND ${CMAKE_COMMAND} -E rm -rf ${MC_DIST_CKPT8} ${MC_DIST_CKPT8}-dp2ep2)
  set_tests_properties(dist.ckpt8_clean PROPERTIES FIXTURES_SETUP dist_ckpt8_clean)
  mc_dist_test(dist.ckpt8_save_pp2_tp2_dp2_sp_ep2 8 $<TARGET_FILE:dist_train> 2 2 1 1 --ep 2 --pp 2 --split AE|MR --save ${MC_DIST_CKPT8})
  set_tests_properties(dist.ckpt8_save_pp2_tp2_dp2_sp_ep2 PROPERTIES FIXTURES_REQUIRED dist_ckpt8_clean FIXTURES_SETUP dist_ckpt8)
  mc_dist_test(dist.ckpt8_resume_tp2_dp2_zero3 4 $<TARGET_FILE:dist_train> 2 2 0 3 --pattern AEMR --resume ${MC_DIST_CKPT8})
  mc_dist_test(dist.ckpt8_resume_pp2 2 $<TARGET_FILE:dist_train> 1 1 0 0 --pp 2 --split AEM|R --resume ${MC_DIST_CKPT8})
  set_tests_properties(dist.ckpt8_resume_tp2_dp2_zero3 dist.ckpt8_resume_pp2 PROPERTIES FIXTURES_REQUIRED dist_ckpt8)
  if(TARGET mcreshard AND TARGET mcaudit)
    add_test(NAME dist.ckpt8_mcreshard_dp2_ep2
             COMMAND sh -c "'$<TARGET_FILE:mcaudit>' '${MC_DIST_CKPT8}' --verify --no-progress && rm -rf '${MC_DIST_CKPT8}-dp2ep2' && '$<TARGET_FILE:mcreshard>' '${MC_DIST_CKPT8}' '${MC_DIST_CKPT8}-dp2ep2' --tp 1 --dp 2 --pp 1 --ep 2 --zero 1 --split equal --no-progress && '$<TARGET_FILE:mcaudit>' '${MC_DIST_CKPT8}-dp2ep2' --verify --no-progress && cp '${MC_DIST_CKPT8}/losses.txt' '${MC_DIST_CKPT8}-dp2ep2/'")
    set_tests_properties(dist.ckpt8_mcreshard_dp2_ep2 PROPERTIES FIXTURES_REQUIRED dist_ckpt8 FIXTURES_SETUP dist_ckpt8_rs)
    mc_dist_test(dist.ckpt8_resume_resharded_dp2_ep2 2 $<TARGET_FILE:dist_train> 1 2 0 1 --ep 2 --pattern AEMR --resume ${MC_DIST_CKPT8}-dp2ep2)
    set_tests_properties(dist.ckpt8_resume_resharded_dp2_ep2 PROPERTIES FIXTURES_REQUIRED dist_ckpt8_rs)
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
    foreach(mode equal resume stop kill stall errors async output)
      add_test(NAME dist.mctrain_${mode} COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/mctrain_mpi.sh ${mode})
      set_tests_properties(dist.mctrain_${mode} PROPERTIES ENVIRONMENT "${MC_DIST_ENV};MC_MPIRUN=${MC_DIST_MPIRUN}" TIMEOUT 180)
    endforeach()
    # configs/nam-medium.json's pattern and layout at CPU size against one process
    add_test(NAME dist.nam_medium_cpu COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/mctrain_mpi.sh nam_medium)
    set_tests_properties(dist.nam_medium_cpu PROPERTIES ENVIRONMENT "${MC_DIST_ENV};MC_MPIRUN=${MC_DIST_MPIRUN}" TIMEOUT 300)
  endif()
endif()
