#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include "CTandemFailingDisk.h"

// How SQLite's own test VFSes wrap another (src/test_vfstrace.c, ext/misc/vfsstat.c): each
// open file is this struct followed by the wrapped VFS's own file, and every method but xSync
// forwards to the wrapped one.

typedef struct FailingFile {
    sqlite3_file base;
    sqlite3_file *real;
    char *path;
} FailingFile;

static sqlite3_vfs *wrapped;
static sqlite3_vfs failing_vfs;
static sqlite3_io_methods failing_methods;

/// The files armed, each by the suffix of its path, with how many syncs are still to fail
/// (-1: all). Several tests may arm their own files at once.
#define MAX_ARMED 32
static pthread_mutex_t armed_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { char *suffix; int count; int failed; } armed[MAX_ARMED];
static int failed_count;

static int ends_with(const char *text, const char *suffix) {
    size_t length = strlen(text), suffix_length = strlen(suffix);
    return length >= suffix_length && strcmp(text + length - suffix_length, suffix) == 0;
}

/// Whether this sync fails, counting it off the armed ones.
static int sync_fails(FailingFile *file) {
    int fails = 0;
    pthread_mutex_lock(&armed_lock);
    for (int index = 0; file->path && index < MAX_ARMED && !fails; index++) {
        if (armed[index].suffix && armed[index].count != 0 && ends_with(file->path, armed[index].suffix)) {
            fails = 1;
            failed_count += 1;
            armed[index].failed += 1;
            if (armed[index].count > 0) armed[index].count -= 1;
        }
    }
    pthread_mutex_unlock(&armed_lock);
    return fails;
}

#define REAL(file) (((FailingFile *)(file))->real)

static int failing_close(sqlite3_file *file) {
    FailingFile *self = (FailingFile *)file;
    int rc = self->real->pMethods->xClose(self->real);
    free(self->path);
    self->path = NULL;
    return rc;
}
static int failing_read(sqlite3_file *file, void *buffer, int amount, sqlite3_int64 offset) {
    return REAL(file)->pMethods->xRead(REAL(file), buffer, amount, offset);
}
static int failing_write(sqlite3_file *file, const void *buffer, int amount, sqlite3_int64 offset) {
    return REAL(file)->pMethods->xWrite(REAL(file), buffer, amount, offset);
}
static int failing_truncate(sqlite3_file *file, sqlite3_int64 size) {
    return REAL(file)->pMethods->xTruncate(REAL(file), size);
}
static int failing_sync(sqlite3_file *file, int flags) {
    if (sync_fails((FailingFile *)file)) return SQLITE_IOERR_FSYNC;
    return REAL(file)->pMethods->xSync(REAL(file), flags);
}
static int failing_file_size(sqlite3_file *file, sqlite3_int64 *size) {
    return REAL(file)->pMethods->xFileSize(REAL(file), size);
}
static int failing_lock(sqlite3_file *file, int lock) { return REAL(file)->pMethods->xLock(REAL(file), lock); }
static int failing_unlock(sqlite3_file *file, int lock) { return REAL(file)->pMethods->xUnlock(REAL(file), lock); }
static int failing_check_reserved_lock(sqlite3_file *file, int *out) {
    return REAL(file)->pMethods->xCheckReservedLock(REAL(file), out);
}
static int failing_file_control(sqlite3_file *file, int op, void *argument) {
    return REAL(file)->pMethods->xFileControl(REAL(file), op, argument);
}
static int failing_sector_size(sqlite3_file *file) { return REAL(file)->pMethods->xSectorSize(REAL(file)); }
static int failing_device_characteristics(sqlite3_file *file) {
    return REAL(file)->pMethods->xDeviceCharacteristics(REAL(file));
}
static int failing_shm_map(sqlite3_file *file, int region, int size, int extend, void volatile **out) {
    return REAL(file)->pMethods->xShmMap(REAL(file), region, size, extend, out);
}
static int failing_shm_lock(sqlite3_file *file, int offset, int count, int flags) {
    return REAL(file)->pMethods->xShmLock(REAL(file), offset, count, flags);
}
static void failing_shm_barrier(sqlite3_file *file) { REAL(file)->pMethods->xShmBarrier(REAL(file)); }
static int failing_shm_unmap(sqlite3_file *file, int delete_flag) {
    return REAL(file)->pMethods->xShmUnmap(REAL(file), delete_flag);
}
static int failing_fetch(sqlite3_file *file, sqlite3_int64 offset, int amount, void **out) {
    return REAL(file)->pMethods->xFetch(REAL(file), offset, amount, out);
}
static int failing_unfetch(sqlite3_file *file, sqlite3_int64 offset, void *pointer) {
    return REAL(file)->pMethods->xUnfetch(REAL(file), offset, pointer);
}

static int failing_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags, int *out_flags) {
    (void)vfs;
    FailingFile *self = (FailingFile *)file;
    memset(self, 0, sizeof(*self));
    self->real = (sqlite3_file *)&self[1];
    int rc = wrapped->xOpen(wrapped, name, self->real, flags, out_flags);
    if (self->real->pMethods == NULL) return rc;
    self->path = name ? strdup(name) : NULL;
    self->base.pMethods = &failing_methods;
    return rc;
}
static int failing_delete(sqlite3_vfs *vfs, const char *name, int sync_dir) {
    (void)vfs;
    return wrapped->xDelete(wrapped, name, sync_dir);
}
static int failing_access(sqlite3_vfs *vfs, const char *name, int flags, int *out) {
    (void)vfs;
    return wrapped->xAccess(wrapped, name, flags, out);
}
static int failing_full_pathname(sqlite3_vfs *vfs, const char *name, int size, char *out) {
    (void)vfs;
    return wrapped->xFullPathname(wrapped, name, size, out);
}

int tandem_failing_disk_install(void) {
    static pthread_mutex_t install_lock = PTHREAD_MUTEX_INITIALIZER;
    int rc = SQLITE_OK;
    pthread_mutex_lock(&install_lock);
    if (wrapped == NULL) {
        rc = sqlite3_initialize();
        sqlite3_vfs *found = rc == SQLITE_OK ? sqlite3_vfs_find(NULL) : NULL;
        if (found == NULL) {
            if (rc == SQLITE_OK) rc = SQLITE_ERROR;
        } else {
            // Version 3, as the unix VFS's files are (shared memory, memory-mapped reads).
            failing_methods = (sqlite3_io_methods){
                3, failing_close, failing_read, failing_write, failing_truncate, failing_sync,
                failing_file_size, failing_lock, failing_unlock, failing_check_reserved_lock,
                failing_file_control, failing_sector_size, failing_device_characteristics, failing_shm_map,
                failing_shm_lock, failing_shm_barrier, failing_shm_unmap, failing_fetch, failing_unfetch,
            };
            // The rest of the wrapped VFS (randomness, time, sleep, system calls) as it is.
            failing_vfs = *found;
            failing_vfs.zName = "tandem-failing-disk";
            failing_vfs.szOsFile = (int)sizeof(FailingFile) + found->szOsFile;
            failing_vfs.pNext = NULL;
            failing_vfs.xOpen = failing_open;
            failing_vfs.xDelete = failing_delete;
            failing_vfs.xAccess = failing_access;
            failing_vfs.xFullPathname = failing_full_pathname;
            wrapped = found;
            rc = sqlite3_vfs_register(&failing_vfs, 1);
        }
    }
    pthread_mutex_unlock(&install_lock);
    return rc;
}

int tandem_failing_disk_fail_syncs(const char *suffix, int count) {
    int rc = 0;
    pthread_mutex_lock(&armed_lock);
    int free_slot = -1, slot = -1;
    for (int index = 0; index < MAX_ARMED; index++) {
        if (armed[index].suffix && strcmp(armed[index].suffix, suffix) == 0) slot = index;
        if (!armed[index].suffix && free_slot < 0) free_slot = index;
    }
    if (count == 0) {
        if (slot >= 0) {
            free(armed[slot].suffix);
            armed[slot].suffix = NULL;
        }
    } else if (slot >= 0) {
        armed[slot].count = count;
    } else if (free_slot >= 0) {
        armed[free_slot].suffix = strdup(suffix);
        armed[free_slot].count = count;
        armed[free_slot].failed = 0;
    } else {
        rc = -1;
    }
    pthread_mutex_unlock(&armed_lock);
    return rc;
}

int tandem_failing_disk_failed_syncs(const char *suffix) {
    pthread_mutex_lock(&armed_lock);
    int count = suffix ? 0 : failed_count;
    for (int index = 0; suffix && index < MAX_ARMED; index++) {
        if (armed[index].suffix && strcmp(armed[index].suffix, suffix) == 0) count = armed[index].failed;
    }
    pthread_mutex_unlock(&armed_lock);
    return count;
}
