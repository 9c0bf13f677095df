# Docs that run (issue 18): tests/docs/run_docs.py runs every command of README.md and
# docs/*.md as written, in order, one fresh directory per document (convention:
# tests/docs/README.md), and checks every --flag the docs give a MegaC program against its
# --help. 70-105 s on a shared 2-core machine (about 24 s of CPU; mostly mpirun starts).
# `run_docs.py --list-gpu` prints the GPU-only commands.
find_program(MC_PYTHON3 python3)
if(MC_PYTHON3 AND TARGET mctrain)
  add_test(NAME docs.run
           COMMAND ${MC_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/run_docs.py
                   --src ${MC_SOURCE_DIR} --bin ${CMAKE_BINARY_DIR} --timeout 120)
  set_tests_properties(docs.run PROPERTIES TIMEOUT 600
    ENVIRONMENT "MC_SOURCE_DIR=${MC_SOURCE_DIR};MC_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()
# The runner itself on synthetic documents and stand-in programs (about 1 s).
if(MC_PYTHON3)
  add_test(NAME docs.runner_selftest COMMAND ${MC_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_run_docs.py)
  set_tests_properties(docs.runner_selftest PROPERTIES TIMEOUT 60)
endif()
