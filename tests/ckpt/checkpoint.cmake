# Checkpoint tests beyond the test_*.c executables: the crash mode of the fault test, the
# MPI test under four processes, and the Python interop checks (h5py + hashlib, jsonschema) on a sample checkpoint written by
# test_ckpt_roundtrip --write. Python is Debian's /usr/bin/python3 (h5py, jsonschema).
if(TARGET test_ckpt_fault)
  add_test(NAME ckpt.test_ckpt_fault_crash COMMAND test_ckpt_fault --crash WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(ckpt.test_ckpt_fault_crash PROPERTIES ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()
if(TARGET test_ckpt_roundtrip)
  foreach(py h5py schema)
    add_test(NAME ckpt.test_ckpt_${py}
             COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/ckpt/test_ckpt_${py}.py $<TARGET_FILE:test_ckpt_roundtrip>
             WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
    set_tests_properties(ckpt.test_ckpt_${py} PROPERTIES ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
  endforeach()
endif()
# Format version 2 checkpoints (before optimizer groups) load as AdamW; a rank file's optimizer
# attribute is checked (tests/ckpt/test_ckpt_v2.py, through test_ckpt_optim's modes).
if(TARGET test_ckpt_optim)
  add_test(NAME ckpt.test_ckpt_v2
           COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/ckpt/test_ckpt_v2.py $<TARGET_FILE:test_ckpt_optim>
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(ckpt.test_ckpt_v2 PROPERTIES ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()
# Several MPI processes writing one checkpoint: the test links MPI itself (the library does
# not); run as one process by the default registration and as four under mpirun.
if(TARGET test_ckpt_mpi)
  target_link_libraries(test_ckpt_mpi PRIVATE MPI::MPI_C)
  set(MC_CKPT_MPI_ENV "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR};OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  set_tests_properties(ckpt.test_ckpt_mpi PROPERTIES ENVIRONMENT "${MC_CKPT_MPI_ENV}")
  # Run as one process, Open MPI starts as a singleton and leaves a stale dynamic-TLS range on
  # the main thread (0x3b62-0x400004c64 here) that LeakSanitizer's exit check reads and dies on
  # ('Tracer caught signal 11', GCC 12 and glibc 2.36). Not scanning TLS for roots can only
  # report more leaks, never hide one; the other tests keep TLS roots (libgomp's thread pool
  # lives there).
  if(MC_SANITIZE)
    set_tests_properties(ckpt.test_ckpt_mpi PROPERTIES ENVIRONMENT_MODIFICATION "LSAN_OPTIONS=string_append::use_tls=0")
  endif()
  find_program(MC_MPIRUN NAMES mpirun mpiexec)
  if(MC_MPIRUN)
    add_test(NAME ckpt.test_ckpt_mpi_np4 COMMAND ${MC_MPIRUN} --oversubscribe -np 4 $<TARGET_FILE:test_ckpt_mpi>
             WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
    set_tests_properties(ckpt.test_ckpt_mpi_np4 PROPERTIES ENVIRONMENT "${MC_CKPT_MPI_ENV}")
  endif()
endif()

# The save's pwrite failing (tests/reliability/enospc_shim.c, LD_PRELOAD; the shim's target is
# defined by tests/reliability/reliability.cmake): a budget of 6 MB for step_2.tmp's files.
if(TARGET test_ckpt_pwrite)
  add_test(NAME ckpt.test_ckpt_pwrite_enospc COMMAND test_ckpt_pwrite --enospc WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  # ASan (an MC_SANITIZE build) wants to come first; the shim must precede libc's pwrite.
  set_tests_properties(ckpt.test_ckpt_pwrite_enospc PROPERTIES ENVIRONMENT
    "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR};LD_PRELOAD=$<TARGET_FILE:mc_enospc_shim>;MC_ENOSPC_MATCH=step_2.tmp;MC_ENOSPC_AFTER=6000000"
    ENVIRONMENT_MODIFICATION "ASAN_OPTIONS=string_append::verify_asan_link_order=0")
endif()
# A deadlock (e.g. in the barrier protocol) must fail the test, not hang the run.
foreach(t test_ckpt_roundtrip test_ckpt_corrupt test_ckpt_fault test_ckpt_fault_crash test_ckpt_async test_ckpt_h5py
          test_ckpt_schema test_ckpt_mpi test_ckpt_mpi_np4 test_ckpt_optim test_ckpt_v2 test_ckpt_pwrite
          test_ckpt_pwrite_enospc test_ckpt_stream)
  if(TEST ckpt.${t})
    set_tests_properties(ckpt.${t} PROPERTIES TIMEOUT 120)
  endif()
endforeach()
# Datasets above the writer's 8 MiB slab (ckpt_h5.c write_in_slabs): a model whose embedding
# is 16 MiB (vocabulary 65536 x 64) is saved, mcaudit --verify re-hashes every shard from the file against the hashes
# taken from memory, and the run resumes from it.
if(TARGET mctrain AND TARGET mcaudit AND TARGET mcdata)
  add_test(NAME ckpt.slab_write COMMAND bash -c
    "set -e; d=$(mktemp -d); trap 'rm -rf $d' EXIT; cd $d; $<TARGET_FILE:mcdata> -o c.h5 ${MC_SOURCE_DIR}/docs/checkpoint.md > /dev/null; \
     $<TARGET_FILE:mctrain> --set data.path=c.h5 --set model.vocab_size=65536 --set checkpoint.dir=big --until 2 > train.log; \
     /usr/bin/python3 -c \"import h5py; assert h5py.File('big/step_2/rank_0.h5')['embed.weight/exp_avg'].nbytes > 8 << 20\"; \
     $<TARGET_FILE:mcaudit> big --verify; \
     $<TARGET_FILE:mctrain> --set data.path=c.h5 --set model.vocab_size=65536 --set checkpoint.dir=big2 --resume big/step_2 --until 3 > resume.log")
  # The same under checkpoint.compress=deflate: the 16 MiB embedding is four 4 MiB chunks,
  # two per slab; its hashes equal the uncompressed save's.
  add_test(NAME ckpt.slab_write_deflate COMMAND bash -c
    "set -e; d=$(mktemp -d); trap 'rm -rf $d' EXIT; cd $d; $<TARGET_FILE:mcdata> -o c.h5 ${MC_SOURCE_DIR}/docs/checkpoint.md > /dev/null;      $<TARGET_FILE:mctrain> --set data.path=c.h5 --set model.vocab_size=65536 --set checkpoint.dir=big --until 2 > train.log;      $<TARGET_FILE:mctrain> --set data.path=c.h5 --set model.vocab_size=65536 --set checkpoint.dir=z --set checkpoint.compress=deflate --until 2 > trainz.log;      /usr/bin/python3 -c \"import h5py, json; d = h5py.File('z/step_2/rank_0.h5')['embed.weight/exp_avg']; assert d.nbytes > 8 << 20 and d.chunks == (16384, 64) and d.compression == 'gzip' and d.shuffle, (d.chunks, d.compression); \
       h = lambda r: sorted((s['dataset'], s['sha256']) for s in json.load(open(r + '/step_2/manifest.json'))['shards']); assert h('big') == h('z')\";      $<TARGET_FILE:mcaudit> z --verify;      $<TARGET_FILE:mctrain> --set data.path=c.h5 --set model.vocab_size=65536 --set checkpoint.dir=z2 --resume z/step_2 --until 3 > resume.log")
endif()
# checkpoint.compress=deflate and mcdata --compress end to end: losses, hashes, verify,
# resume, mceval and reshard against the uncompressed run (tests/ckpt/test_ckpt_deflate.py).
if(TARGET mctrain AND TARGET mcaudit AND TARGET mcdata AND TARGET mceval AND TARGET mcreshard)
  add_test(NAME ckpt.deflate COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/ckpt/test_ckpt_deflate.py)
  set_tests_properties(ckpt.deflate PROPERTIES TIMEOUT 600
                       ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()
# A row above the 4 MiB chunk limit (an expert weight of 2 x 2048 x 1024: 8 MiB a row) is cut
# on its next dimension under checkpoint.compress=deflate: chunks (1, 1024, 1024); the
# checkpoint verifies (mcaudit re-hashes the inflated data against the hashes from memory).
if(TARGET mctrain AND TARGET mcaudit AND TARGET mcdata)
  add_test(NAME ckpt.wide_rows_deflate COMMAND bash -c
    "set -e; d=$(mktemp -d); trap 'rm -rf $d' EXIT; cd $d; $<TARGET_FILE:mcdata> -o c.h5 ${MC_SOURCE_DIR}/docs/checkpoint.md > /dev/null; \
     $<TARGET_FILE:mctrain> --set data.path=c.h5 --set model.pattern=E --set model.d_model=1024 --set model.n_heads=8 \
       --set model.head_dim=128 --set model.n_kv_heads=4 --set model.expert_hidden=2048 --set model.n_experts=2 \
       --set model.top_k=1 --set model.seq_len=8 --set train.global_batch=1 --set train.micro_batch=1 \
       --set checkpoint.dir=z --set checkpoint.compress=deflate --until 1 > train.log; \
     /usr/bin/python3 -c \"import h5py; d = h5py.File('z/step_1/rank_0.h5')['layers.00.moe.w1/exp_avg_sq']; assert d.shape == (2, 2048, 1024) and d.chunks == (1, 1024, 1024) and d.compression == 'gzip' and d.shuffle, d.chunks\"; \
     $<TARGET_FILE:mcaudit> z --verify --no-progress")
endif()
