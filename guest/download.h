/*
 * A tensor range read back into the program's memory through the data area
 * (download.c).
 */
#ifndef APIR_DOWNLOAD_H
#define APIR_DOWNLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "apir_tensor.h"
#include "remote.h"

/* Where a download in pieces puts its bytes in the data area: its first
 * page holds the progress words (struct apir_chunk_progress). */
#define APIR_DOWNLOAD_AREA_OFFSET 4096u

/* Bytes per piece from APIR_GET_PIECE_KB (default 4096; 0: downloads are
 * never split into pieces), for struct apir_remote's get_piece. */
size_t apir_download_piece_from_env(void);

/*
 * Reads [offset, offset + size) of the tensor rec, in the host buffer
 * `buffer`, into dst, a data area's worth per command (lock held).  Where
 * the host and transport allow it (apir 0.6, shm) each command is a
 * BUFFER_GET_TENSOR_CHUNKED whose pieces are copied out while the host
 * writes the next ones; else BUFFER_GET_TENSOR.  Returns APIR_HANDLER_OK,
 * or the failing command's result (-1: the transport), with dst zeroed from
 * that command's range on.
 */
int apir_download_locked(struct apir_remote *r, uint64_t buffer, const struct apir_tensor_rec *rec, uint64_t offset,
                         void *dst, size_t size);

#endif
