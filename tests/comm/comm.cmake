# The collectives under four oversubscribed MPI ranks.
find_program(MC_MPIRUN NAMES mpirun mpiexec)
if(MC_MPIRUN)
  add_test(NAME comm.test_comm_mpi_np4
           COMMAND ${MC_MPIRUN} --oversubscribe -np 4 $<TARGET_FILE:test_comm_mpi>)
  set_tests_properties(comm.test_comm_mpi_np4 PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endif()
