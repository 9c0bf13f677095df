# The CLI end-to-end test: mcreshard, mcaudit and bench_reshard (its --synth --tiny makes
# the source checkpoint) and sim_scale (--write-metadata: a checkpoint without data), checked
# with h5py/numpy/hashlib/jsonschema from Debian's python.
if(TARGET mcreshard AND TARGET mcaudit AND TARGET bench_reshard AND TARGET sim_scale)
  add_test(NAME reshard.test_reshard_cli
           COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/reshard/test_reshard_cli.py
                   $<TARGET_FILE:mcreshard> $<TARGET_FILE:mcaudit> $<TARGET_FILE:bench_reshard>
                   $<TARGET_FILE:sim_scale>
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(reshard.test_reshard_cli PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()

# Hugging Face export and import (tests/reshard/test_reshard_hf.py, docs/export.md): a tiny dense
# model trained by mctrain, exported with Llama names, checked against a numpy LlamaForCausalLM
# and mceval --dump-logits; fp32/bf16 round trips, sharding, foreign Llama files, refusals.
# With the ENOSPC shim of tests/reliability (when built), a full disk during an export too.
if(TARGET mcreshard AND TARGET mctrain AND TARGET mcdata AND TARGET mceval)
  set(MC_HF_SHIM "")
  if(TARGET mc_enospc_shim)
    set(MC_HF_SHIM $<TARGET_FILE:mc_enospc_shim>)
  endif()
  add_test(NAME reshard.test_reshard_hf
           COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/reshard/test_reshard_hf.py
                   $<TARGET_FILE:mcreshard> $<TARGET_FILE:mctrain> $<TARGET_FILE:mcdata> $<TARGET_FILE:mceval>
                   ${MC_HF_SHIM}
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(reshard.test_reshard_hf PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR};OMP_NUM_THREADS=1" TIMEOUT 300)
endif()

# Stored states in narrower element dtypes (tests/reshard/test_reshard_dtype.py): mcreshard
# --state-dtype over random layouts and dtype choices (AdamW and Muon groups), the values
# against numpy's conversions, A -> B -> A byte for byte, mcaudit --verify, what h5py reads,
# the refusals, a dry run, and mctrain --resume from converted checkpoints of the tiny configs.
if(TARGET mcreshard AND TARGET mcaudit AND TARGET bench_reshard AND TARGET mctrain AND TARGET mcdata)
  add_test(NAME reshard.test_reshard_dtype
           COMMAND /usr/bin/python3 ${MC_SOURCE_DIR}/tests/reshard/test_reshard_dtype.py
                   $<TARGET_FILE:mcreshard> $<TARGET_FILE:mcaudit> $<TARGET_FILE:bench_reshard>
                   $<TARGET_FILE:mctrain> $<TARGET_FILE:mcdata>
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(reshard.test_reshard_dtype PROPERTIES
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR};OMP_NUM_THREADS=1" TIMEOUT 600)
endif()
