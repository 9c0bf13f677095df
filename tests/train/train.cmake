# End-to-end tests of the training tools (tests/train/e2e.sh MODE): a short run learns, bit-exact
# resume (also from a checkpoint resharded by mcreshard), mceval agrees with the trainer under
# any checkpoint layout, bad input gives clear errors. train.cuda_match (tests/train/cuda_train.sh):
# mctrain on the CUDA backend against the CPU and checkpoints across the two; it prints
# "SKIP: no CUDA device" and passes where there is none; train.cuda_bf16 likewise for
# train.dtype=bf16 (bf16 products) against the fp32 CPU run, train.cuda_async for checkpoints taken
# while a GPU run trains on (losses and resume, a full disk), and train.cuda_recompute for
# train.recompute=selective and full against none on the GPU, train.cuda_muon for Muon groups
# (optim.groups) against the CPU. train.nccl_* (tests/train/nccl_train.sh):
# several GPUs through NCCL against the one-GPU run (layouts, zero3, muon, bf16, resume, kill, stall, nodes,
# launchers); they print "SKIP: ..." and pass with fewer than 2 GPUs. train.tfevents_run
# (tests/train/tfevents.sh): the TensorBoard event file of a run read back against metrics.jsonl.
if(TARGET mctrain AND TARGET mceval AND TARGET mcdata AND TARGET mcreshard)
  find_program(MC_TRAIN_MPIRUN NAMES mpirun mpiexec)
  foreach(test e2e:learn e2e:resume e2e:muon e2e:eval e2e:errors tfevents:run cuda_train:match cuda_train:bf16 cuda_train:async cuda_train:muon
               cuda_train:recompute nccl_train:layouts nccl_train:zero3 nccl_train:muon
               nccl_train:bf16 nccl_train:resume nccl_train:kill nccl_train:stall nccl_train:nodes nccl_train:launchers)
    string(REPLACE ":" ";" parts ${test})
    list(GET parts 0 script)
    list(GET parts 1 mode)
    string(REPLACE "cuda_train" "cuda" prefix ${script})
    string(REPLACE "nccl_train" "nccl" prefix ${prefix})
    add_test(NAME train.${prefix}_${mode} COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/${script}.sh ${mode})
    set_tests_properties(train.${prefix}_${mode} PROPERTIES
      ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR};OMP_NUM_THREADS=2;MC_MPIRUN=${MC_TRAIN_MPIRUN}"
      TIMEOUT 600)
  endforeach()
  if(TARGET mc_enospc_shim) # the disk-full part of cuda_async
    set_property(TEST train.cuda_async APPEND PROPERTY ENVIRONMENT "MC_ENOSPC_SHIM=$<TARGET_FILE:mc_enospc_shim>")
  endif()
endif()
