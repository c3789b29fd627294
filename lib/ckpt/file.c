/* SPDX-License-Identifier: MIT */
/* Metadata files. Saving is atomic: the document goes to a temporary file
 * in the target's directory (so rename stays within one file system), is
 * fsynced, renamed over the target, and the directory is fsynced so the
 * rename itself survives a crash. A reader therefore sees the old file or
 * the new one, never a torn one. A writer killed midway can leave its
 * temporary "<path>.tmp.<pid>.<n>" behind; nothing ever reads those. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/meta.h"

static cp_status io_error(const char *func, const char *what, const char *path, int err)
{
    return cpi_error(err == ENOENT ? CP_ERROR_NOT_FOUND : CP_ERROR_IO, "%s: %s \"%s\": %s", func, what, path,
                     strerror(err));
}

static cp_status write_all(int fd, const char *p, size_t n, const char *path)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return io_error("cp_ckpt_meta_save", "cannot write", path, w < 0 ? errno : EIO);
        p += w;
        n -= (size_t)w;
    }
    return CP_SUCCESS;
}

static cp_status fsync_fd(int fd, const char *what, const char *path)
{
    while (fsync(fd) != 0)
        if (errno != EINTR)
            return io_error("cp_ckpt_meta_save", what, path, errno);
    return CP_SUCCESS;
}

/* fsync the directory that holds path, so a rename in it is durable. */
static cp_status fsync_parent(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return io_error("cp_ckpt_meta_save", "cannot open the directory", dir, errno);
    cp_status s = fsync_fd(fd, "cannot fsync the directory", dir);
    close(fd);
    return s;
}

/* Create a new temporary file next to path; mode 0666 less the umask, as
 * for any file the program creates. */
static cp_status open_temporary(const char *path, char tmp[PATH_MAX], int *fd)
{
    static atomic_uint counter;
    for (int attempt = 0; attempt < 100; attempt++) {
        unsigned n = atomic_fetch_add(&counter, 1);
        int len = snprintf(tmp, PATH_MAX, "%s.tmp.%ld.%u", path, (long)getpid(), n);
        if (len < 0 || len >= PATH_MAX)
            return cpi_error(CP_ERROR_INVALID_ARGUMENT, "cp_ckpt_meta_save: path = \"%.64s...\" is too long",
                             path);
        *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (*fd >= 0)
            return CP_SUCCESS;
        if (errno != EEXIST) /* a stale file of an earlier process with our pid: try the next name */
            return io_error("cp_ckpt_meta_save", "cannot create a temporary file next to", path, errno);
    }
    return cpi_error(CP_ERROR_IO, "cp_ckpt_meta_save: no free temporary name next to \"%s\"", path);
}

CP_EXPORT cp_status cp_ckpt_meta_save(const cp_ckpt_meta *m, const char *path)
{
    CPI_CHECK_PTR(m);
    CPI_CHECK_PTR(path);
    CPI_CHECK(*path != '\0', "%s: path = \"\" (empty)", __func__);
    char *text;
    size_t len;
    CPI_TRY(cpi_ckpt_dump(m, __func__, &text, &len));

    char tmp[PATH_MAX];
    int fd = -1;
    cp_status s = open_temporary(path, tmp, &fd);
    if (s != CP_SUCCESS) {
        free(text);
        return s;
    }
    s = write_all(fd, text, len, tmp);
    free(text);
    if (s == CP_SUCCESS)
        s = fsync_fd(fd, "cannot fsync", tmp);
    if (close(fd) != 0 && s == CP_SUCCESS)
        s = io_error(__func__, "cannot close", tmp, errno);
    if (s == CP_SUCCESS && rename(tmp, path) != 0)
        s = io_error(__func__, "cannot rename the temporary file over", path, errno);
    if (s != CP_SUCCESS) {
        unlink(tmp);
        return s;
    }
    return fsync_parent(path);
}

CP_EXPORT cp_status cp_ckpt_meta_load(const char *path, cp_ckpt_meta **out)
{
    CPI_CHECK_PTR(out);
    *out = NULL;
    CPI_CHECK_PTR(path);
    CPI_CHECK(*path != '\0', "%s: path = \"\" (empty)", __func__);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return io_error(__func__, "cannot open", path, errno);
    /* Read one byte past the limit to tell "at the limit" from "over it",
     * whatever fstat says (pipes and /proc files report no size). */
    size_t cap = CP_CKPT_META_MAX_BYTES + 1, n = 0;
    char *buf = malloc(cap);
    cp_status s = buf ? CP_SUCCESS : cpi_error(CP_ERROR_OUT_OF_MEMORY, "%s: out of host memory", __func__);
    while (s == CP_SUCCESS && n < cap) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            s = io_error(__func__, "cannot read", path, errno);
        else if (r == 0)
            break;
        else
            n += (size_t)r;
    }
    close(fd);
    if (s == CP_SUCCESS && n > CP_CKPT_META_MAX_BYTES)
        s = cpi_error(CP_ERROR_FORMAT, "%s: \"%s\" is over the %u-byte limit", __func__, path,
                      CP_CKPT_META_MAX_BYTES);
    if (s == CP_SUCCESS && (s = cp_ckpt_meta_from_json(buf, n, out)) != CP_SUCCESS) {
        char why[512]; /* the parser's message, which does not know the path */
        snprintf(why, sizeof why, "%s", cp_last_error());
        cpi_error(s, "%s: \"%s\": %s", __func__, path, why);
    }
    free(buf);
    return s;
}
