/* Jobs 0..n-1 run on worker threads: the checkpoint library's hashing, reads and writes and the
 * trainer's load copies. */
#ifndef MC_UTIL_POOL_H
#define MC_UTIL_POOL_H

/* A pool running jobs 0..n-1 on `threads` threads, taken in index order, so a consumer can
 * wait for job j while later ones still run. fn returns 0 or -1 (with mc_error). */
typedef int (*mc_job_fn)(void *ctx, int job);
typedef struct mc_pool mc_pool;
mc_pool *mc_pool_start(int n_jobs, int threads, mc_job_fn fn, void *ctx);
/* Waits for job j; returns its result, copying its error message to the caller's thread. */
int mc_pool_wait_job(mc_pool *p, int j);
/* Stops taking new jobs (after a consumer failure); jobs already running finish. */
void mc_pool_cancel(mc_pool *p);
/* Joins and frees; returns -1 with the first failing job's message if any job failed. */
int mc_pool_finish(mc_pool *p);
/* Runs all jobs and returns like mc_pool_finish. */
int mc_parallel(int n_jobs, int threads, mc_job_fn fn, void *ctx);

#endif
