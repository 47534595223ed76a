/*
 * private_shm.c: keeps the files tritonserver and its Python-backend stubs put in /dev/shm
 * private to their owner from the first byte.
 *
 * Triton 2.51's Python backend makes each instance's shared-memory region with boost's
 * shared_memory_object: shm_open(name, O_CREAT | O_EXCL, 0644), then fchmod(fd, 0644) so that
 * the mode ignores the umask. The launcher runs Triton with umask 077, so the region is born
 * 0600 and the fchmod opens it to every local user; a second user polling /dev/shm could
 * open it before the stub sealed it (core/backend_shm.py).
 *
 * Loaded with LD_PRELOAD into tritonserver (the stubs inherit its environment), this file
 * wraps fchmod, fchmodat and chmod: when the target is a regular file on the filesystem of
 * /dev/shm (same device: a POSIX shared-memory object, whatever name it is reached by),
 * the group and other bits of the requested mode are cleared. Every other call, and every
 * mode that asks for no group or other access, goes to the C library unchanged. The shim
 * only ever takes permissions away, and only from what these processes create or chmod.
 *
 * Built by scripts/setup.sh into .triton/lib/libdispatch_private_shm.so
 * (`cc -shared -fPIC`); ops/triton_runtime.py finds it there.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

typedef int (*fchmod_fn)(int, mode_t);
typedef int (*fchmodat_fn)(int, const char *, mode_t, int);
typedef int (*chmod_fn)(const char *, mode_t);

/* The C library's function `name`, looked up at its first use rather than in a constructor
 * (another library's constructor may call it before this one's would run); threads racing
 * here store the same address. */
static void *real(void **slot, const char *name) {
    void *found = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (found == 0) {
        found = dlsym(RTLD_NEXT, name);
        __atomic_store_n(slot, found, __ATOMIC_RELEASE);
    }
    return found;
}

static void *real_fchmod, *real_fchmodat, *real_chmod;

#define GROUP_OTHER_BITS ((mode_t)(S_IRWXG | S_IRWXO))

/* Whether `target` is a regular file on the filesystem that holds /dev/shm. */
static int on_dev_shm(const struct stat *target) {
    struct stat shm;
    return S_ISREG(target->st_mode) && stat("/dev/shm", &shm) == 0 &&
           target->st_dev == shm.st_dev;
}

/* `mode` without its group and other bits when `looked` (the target was looked at: 0 if it
 * could not be, and the real call then reports why) and the target is on /dev/shm. */
static mode_t applied_mode(mode_t mode, int looked, const struct stat *target) {
    return (looked && on_dev_shm(target)) ? (mode & ~GROUP_OTHER_BITS) : mode;
}

int fchmod(int fd, mode_t mode) {
    fchmod_fn call = (fchmod_fn)real(&real_fchmod, "fchmod");
    struct stat target;
    int saved = errno;
    if (mode & GROUP_OTHER_BITS) {
        mode = applied_mode(mode, fstat(fd, &target) == 0, &target);
    }
    errno = saved;
    if (call == 0) {
        errno = ENOSYS;
        return -1;
    }
    return call(fd, mode);
}

int fchmodat(int dirfd, const char *path, mode_t mode, int flags) {
    fchmodat_fn call = (fchmodat_fn)real(&real_fchmodat, "fchmodat");
    struct stat target;
    int saved = errno;
    if (mode & GROUP_OTHER_BITS) {
        int looked = fstatat(dirfd, path, &target, flags & AT_SYMLINK_NOFOLLOW) == 0;
        mode = applied_mode(mode, looked, &target);
    }
    errno = saved;
    if (call == 0) {
        errno = ENOSYS;
        return -1;
    }
    return call(dirfd, path, mode, flags);
}

int chmod(const char *path, mode_t mode) {
    chmod_fn call = (chmod_fn)real(&real_chmod, "chmod");
    struct stat target;
    int saved = errno;
    if (mode & GROUP_OTHER_BITS) {
        mode = applied_mode(mode, stat(path, &target) == 0, &target);
    }
    errno = saved;
    if (call == 0) {
        errno = ENOSYS;
        return -1;
    }
    return call(path, mode);
}
