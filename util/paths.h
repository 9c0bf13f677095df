/* Output-path safety for tools that write by temporary file + rename (docs/reliability.md):
 * an existing output must be a regular file (a rename would replace a device node or FIFO
 * by a regular file), and a destination must not be, contain or lie inside a source. */
#ifndef MC_UTIL_PATHS_H
#define MC_UTIL_PATHS_H

/* 0 if `path` does not exist or is a regular file (a symbolic link is judged by what it
 * names); else -1: "<what> <path> exists and is not a regular file (<kind>); refusing to
 * replace it". */
int mc_output_file_ok(const char *path, const char *what);

/* 1 if a and b, resolved (symbolic links, "." and ".." in their existing part), are the same
 * path or one lies inside the other; 0 if not; -1 with an error if either cannot be resolved. */
int mc_paths_overlap(const char *a, const char *b);

/* 0 if destination dst and source src do not overlap, else -1: "<dst_what> <dst> is, contains
 * or lies inside <src_what> <src>; refusing to overwrite it". */
int mc_check_disjoint(const char *dst, const char *dst_what, const char *src, const char *src_what);

#endif
