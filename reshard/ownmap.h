/* A picture of ownership: ranks (columns, grouped by pipeline stage) against families
 * (rows), each cell coloured by the family's placement rule where the rank holds part of
 * its param state, its opacity the share held, a dark border on primaries; hovering a cell
 * shows the hyperslab. SVG, or HTML (the SVG with a title and a legend) by file extension. */
#ifndef MC_RESHARD_OWNMAP_H
#define MC_RESHARD_OWNMAP_H

#include "core/ownership.h"

/* Writes `path` (.svg, .html or .htm). `title` may be NULL. */
int mc_rs_ownership_map(const mc_geometry *g, const char *path, const char *title);

#endif
