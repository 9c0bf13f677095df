/* The token dataset (an HDF5 file made by mcdata) and the sample order (docs/design.md section 4).
 *
 * Windows: window i is tokens [i*T, i*T + T + 1) (T = seq_len): inputs [0, T), targets [1, T].
 * Consecutive windows overlap by one token so that every token is a target exactly once.
 * Split: n_val = round(n_windows * val_fraction) windows, spread evenly over the file (window i
 * is held out iff floor((i+1)*n_val/N) > floor(i*n_val/N)), are the validation split; the rest
 * are the training windows, numbered 0..n_train-1 in file order. The split does not depend on
 * the seed.
 * Order: global sample j (0, 1, 2, ...) is training window perm_{seed,e}(j mod n_train) with
 * epoch e = j / n_train, where perm is a keyed bijection (Feistel network over Philox with
 * cycle walking). Step s consumes samples [s*G, (s+1)*G); inside a step, dp rank r takes
 * [r*G/dp, (r+1)*G/dp) and its micro-batch m the next micro_batch of those. Everything is a
 * pure function of (seed, step): the same under every layout. */
#ifndef MC_TRAIN_DATA_H
#define MC_TRAIN_DATA_H

#include <stdint.h>

#define MC_DATA_TOKENIZER_MAX 64

typedef struct {
  char path[1024];
  int64_t id;          /* HDF5 dataset handle (hid_t) of "/tokens" */
  int64_t file;        /* HDF5 file handle */
  int64_t n_tokens;
  int64_t vocab_size;  /* attribute vocab_size */
  int elem_bytes;      /* 2 (uint16) or 4 (uint32) */
  /* A contiguous, unfiltered little-endian "/tokens" is read with pread at raw_offset, outside
   * the HDF5 library (whose one lock an asynchronous checkpoint writer may be holding); fd -1:
   * read through HDF5 (chunked or compressed datasets). */
  int fd;
  int64_t raw_offset;
  char tokenizer[MC_DATA_TOKENIZER_MAX];
  /* Windowing and split for the sequence length given to mc_data_open. */
  int seq_len;
  int64_t n_windows, n_val, n_train;
} mc_data;

/* Opens `path` and checks it: dataset "/tokens" of uint16/uint32, attribute vocab_size, at
 * least one window of seq_len+1 tokens and at least one training window. val_fraction in [0, 1). */
int mc_data_open(mc_data *d, const char *path, int seq_len, double val_fraction);
void mc_data_close(mc_data *d);

/* Checks that the dataset fits a model of vocabulary model_vocab (its vocab_size is not larger). */
int mc_data_check_vocab(const mc_data *d, int model_vocab);

/* Window index (into the file) of training window k in [0, n_train) / validation window j. */
int64_t mc_data_train_window(const mc_data *d, int64_t k);
int64_t mc_data_val_window(const mc_data *d, int64_t j);

/* The keyed bijection on [0, n): perm(seed, epoch, x). */
uint64_t mc_data_permute(uint64_t seed, uint64_t epoch, uint64_t x, uint64_t n);
/* File window index of global training sample j (all epochs). */
int64_t mc_data_sample_window(const mc_data *d, uint64_t seed, int64_t j);
/* First global sample index of (step, dp_rank, micro) for batch G split over dp ranks in
 * micro-batches of mb sequences; that micro-batch is samples [first, first + mb). */
int64_t mc_data_first_sample(int64_t step, int global_batch, int dp, int dp_rank, int micro_batch,
                             int micro);

/* Reads file window `w` (seq_len+1 tokens) into out. Tokens >= vocab_size are an error. */
int mc_data_read_window(const mc_data *d, int64_t w, int32_t *out);
/* Reads samples [first, first+n) of the training order into out (n rows of seq_len+1). */
int mc_data_read_train(const mc_data *d, uint64_t seed, int64_t first, int n, int32_t *out);
/* Reads validation windows [first, first+n) (taken modulo n_val) into out. */
int mc_data_read_val(const mc_data *d, int64_t first, int n, int32_t *out);

#endif
