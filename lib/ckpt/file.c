/* SPDX-License-Identifier: MIT */
/* Metadata files. Saving is atomic: the document goes to a new temporary
 * file in the target's directory (so rename stays within one file system),
 * is fsynced, renamed over the target, and the directory is fsynced so the
 * rename itself survives a crash. A reader therefore sees the old file or
 * the new one, never a torn one. A writer killed midway can leave its
 * temporary "<path>.tmp.XXXXXX" behind; nothing ever reads those.
 *
 * Limits on names and paths are the system's: nothing here has a buffer of
 * PATH_MAX or makes up a length of its own, so a name the file system takes
 * can be saved, and one it refuses fails with its own error text. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/meta.h"

#define SAVE "cp_ckpt_meta_save"

/* The temporary name is the target's, cut if need be, with this after it. */
#define TMP_SUFFIX ".tmp.XXXXXX"
#define TMP_SUFFIX_LEN (sizeof TMP_SUFFIX - 1)
#define TMP_RANDOM 6 /* the X's */

/* A path as messages show it: a long one keeps its first and last bytes, so
 * that the reason after it still fits in cp_last_error(). */
#define SHOWN_MAX 256
static const char *shown(const char *path, char buf[SHOWN_MAX])
{
    size_t n = strlen(path);
    if (n < SHOWN_MAX)
        return path;
    snprintf(buf, SHOWN_MAX, "%.120s...%s", path, path + n - 120);
    return buf;
}

static cp_status io_error(const char *func, const char *what, const char *path, int err)
{
    char buf[SHOWN_MAX];
    return cpi_error(err == ENOENT ? CP_ERROR_NOT_FOUND : CP_ERROR_IO, "%s: %s \"%s\": %s", func, what,
                     shown(path, buf), strerror(err));
}

static cp_status write_all(int fd, const char *p, size_t n, const char *path)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return io_error(SAVE, "cannot write", path, w < 0 ? errno : EIO);
        p += w;
        n -= (size_t)w;
    }
    return CP_SUCCESS;
}

/* fsync, retried on EINTR; 0 or the errno. */
static int fsync_errno(int fd)
{
    while (fsync(fd) != 0)
        if (errno != EINTR)
            return errno;
    return 0;
}

/* Random characters for a temporary name that another process cannot
 * foresee, so that files planted (or left) under guessable names never
 * block a save. Where the kernel gives no random bytes, the clock, the pid
 * and a counter, mixed, still differ from anything made in advance. */
static void random_name(char out[TMP_RANDOM])
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[TMP_RANDOM];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        static atomic_uint counter;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t z = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 30 ^ (uint64_t)getpid() << 17 ^
                     atomic_fetch_add(&counter, 1);
        z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9u; /* splitmix64's finaliser */
        z = (z ^ z >> 27) * 0x94d049bb133111ebu;
        z ^= z >> 31;
        for (int i = 0; i < TMP_RANDOM; i++)
            r[i] = (unsigned char)(z >> 8 * i);
    }
    for (int i = 0; i < TMP_RANDOM; i++)
        out[i] = alphabet[r[i] % (sizeof alphabet - 1)];
}

/* Create a new temporary file in dir, next to path, with mode (less the
 * umask): "<path>.tmp.XXXXXX", the last part of path cut where the whole
 * name would pass the file system's limit, since a target name may use all
 * of it. *tmp is the malloc'd name. */
static cp_status open_temporary(const char *path, const char *dir, mode_t mode, char **tmp, int *fd)
{
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash + 1 - path) : 0, keep = strlen(path) - dirlen;
    long name_max = pathconf(dir, _PC_NAME_MAX);
    if (name_max <= 0)
        name_max = NAME_MAX;
    if (keep + TMP_SUFFIX_LEN > (size_t)name_max)
        keep = (size_t)name_max > TMP_SUFFIX_LEN ? (size_t)name_max - TMP_SUFFIX_LEN : 0;
    char *t = malloc(dirlen + keep + TMP_SUFFIX_LEN + 1);
    if (!t)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "%s: out of host memory", SAVE);
    memcpy(t, path, dirlen + keep);
    char *x = t + dirlen + keep;
    memcpy(x, TMP_SUFFIX, TMP_SUFFIX_LEN + 1);
    for (int attempt = 0; attempt < 100; attempt++) {
        random_name(x + TMP_SUFFIX_LEN - TMP_RANDOM);
        *fd = open(t, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (*fd >= 0) {
            *tmp = t;
            return CP_SUCCESS;
        }
        if (errno != EEXIST) {
            cp_status s = io_error(SAVE, "cannot create a temporary file next to", path, errno);
            free(t);
            return s;
        }
    }
    free(t);
    char buf[SHOWN_MAX];
    return cpi_error(CP_ERROR_IO, "%s: no free temporary name next to \"%s\" in 100 random tries", SAVE,
                     shown(path, buf));
}

/* Write text to a new temporary file next to path, flush it and rename it
 * over path. On failure path is as it was and the temporary file is gone. */
static cp_status replace(const char *path, const char *dir, const char *text, size_t len)
{
    /* The file being replaced keeps its permissions; a new one gets 0666
     * less the umask, as any file a program creates. The temporary file is
     * private until it has them, and is empty until then anyway. */
    struct stat old;
    bool keep_mode = false;
    if (stat(path, &old) == 0) {
        if (S_ISDIR(old.st_mode))
            return io_error(SAVE, "cannot replace", path, EISDIR);
        keep_mode = S_ISREG(old.st_mode);
    } else if (errno != ENOENT) {
        return io_error(SAVE, "cannot look up", path, errno); /* ENAMETOOLONG among others */
    }
    char *tmp = NULL;
    int fd = -1;
    CPI_TRY(open_temporary(path, dir, keep_mode ? 0600 : 0666, &tmp, &fd));
    cp_status s = CP_SUCCESS;
    if (keep_mode && fchmod(fd, old.st_mode & (S_IRWXU | S_IRWXG | S_IRWXO)) != 0)
        s = io_error(SAVE, "cannot set the mode of", tmp, errno);
    if (s == CP_SUCCESS)
        s = write_all(fd, text, len, tmp);
    int err;
    if (s == CP_SUCCESS && (err = fsync_errno(fd)) != 0)
        s = io_error(SAVE, "cannot fsync", tmp, err);
    if (close(fd) != 0 && s == CP_SUCCESS)
        s = io_error(SAVE, "cannot close", tmp, errno);
    if (s == CP_SUCCESS && rename(tmp, path) != 0)
        s = io_error(SAVE, "cannot rename the temporary file over", path, errno);
    if (s != CP_SUCCESS)
        unlink(tmp);
    free(tmp);
    return s;
}

/* Make the rename in dir durable. The new document is in place whatever
 * happens here, so a failure says that, not that the save did not happen. */
static cp_status fsync_dir(const char *path, const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const char *call = "open";
    int err = fd < 0 ? errno : fsync_errno(fd);
    if (fd >= 0) {
        call = "fsync";
        close(fd);
    }
    if (err == 0)
        return CP_SUCCESS;
    char a[SHOWN_MAX], b[SHOWN_MAX];
    return cpi_error(CP_ERROR_IO,
                     "%s: \"%s\" holds the new document, but its directory \"%s\" could not be flushed "
                     "(%s: %s), so a crash may still bring back the old one",
                     SAVE, shown(path, a), shown(dir, b), call, strerror(err));
}

CP_EXPORT cp_status cp_ckpt_meta_save(const cp_ckpt_meta *m, const char *path)
{
    CPI_CHECK_PTR(m);
    CPI_CHECK_PTR(path);
    CPI_CHECK(*path != '\0', "%s: path = \"\" (empty)", __func__);
    char *text;
    size_t len;
    CPI_TRY(cpi_ckpt_dump(m, __func__, &text, &len));

    /* The directory holding path: "." for a bare name, "/" for "/name". */
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    cp_status s = dir ? replace(path, dir, text, len)
                      : cpi_error(CP_ERROR_OUT_OF_MEMORY, "%s: out of host memory", __func__);
    free(text);
    if (s == CP_SUCCESS)
        s = fsync_dir(path, dir);
    free(dir);
    return s;
}

static const char *file_kind(mode_t mode)
{
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    return "of an unknown kind";
}

/* Open path for reading if it is a regular file. O_NONBLOCK because
 * opening a FIFO without a writer would otherwise wait for one forever;
 * a device or FIFO is never read, so a load always returns. */
static cp_status open_regular(const char *path, int *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return io_error("cp_ckpt_meta_load", "cannot open", path, errno);
    struct stat st;
    int fl;
    cp_status s = CP_SUCCESS;
    if (fstat(fd, &st) != 0)
        s = io_error("cp_ckpt_meta_load", "cannot stat", path, errno);
    else if (S_ISDIR(st.st_mode))
        s = io_error("cp_ckpt_meta_load", "cannot read", path, EISDIR);
    else if (!S_ISREG(st.st_mode)) {
        char buf[SHOWN_MAX];
        s = cpi_error(CP_ERROR_IO, "cp_ckpt_meta_load: cannot read \"%s\": not a regular file (it is %s)",
                      shown(path, buf), file_kind(st.st_mode));
    } else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        s = io_error("cp_ckpt_meta_load", "cannot read", path, errno);
    if (s != CP_SUCCESS) {
        close(fd);
        return s;
    }
    *out = fd;
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_ckpt_meta_load(const char *path, cp_ckpt_meta **out)
{
    CPI_CHECK_PTR(out);
    *out = NULL;
    CPI_CHECK_PTR(path);
    CPI_CHECK(*path != '\0', "%s: path = \"\" (empty)", __func__);
    int fd = -1;
    CPI_TRY(open_regular(path, &fd));
    /* Read one byte past the limit to tell "at the limit" from "over it",
     * whatever fstat says (/proc files report no size). */
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
    char shown_buf[SHOWN_MAX];
    if (s == CP_SUCCESS && n > CP_CKPT_META_MAX_BYTES)
        s = cpi_error(CP_ERROR_FORMAT, "%s: \"%s\" is over the %u-byte limit", __func__, shown(path, shown_buf),
                      CP_CKPT_META_MAX_BYTES);
    if (s == CP_SUCCESS && (s = cp_ckpt_meta_from_json(buf, n, out)) != CP_SUCCESS) {
        char why[512]; /* the parser's message, which does not know the path */
        snprintf(why, sizeof why, "%s", cp_last_error());
        cpi_error(s, "%s: \"%s\": %s", __func__, shown(path, shown_buf), why);
    }
    free(buf);
    return s;
}
