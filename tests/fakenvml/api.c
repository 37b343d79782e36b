/*
 * The exported NVML entry points of the stand-in libnvidia-ml.so.1.
 *
 * Every function is defined against its prototype in the official nvml.h, so
 * a signature that drifts from the header fails to compile. The header is
 * included with default visibility; everything else in the library is hidden.
 *
 * All state is behind one mutex. Each call (after nvmlInit) re-reads the
 * device file when its identity (device, inode, size, mtime in ns) changed.
 * Device handles point into static arrays indexed by host slot, so a handle
 * stays valid across reloads for as long as its device exists.
 */
#define _GNU_SOURCE
#pragma GCC visibility push(default)
#include <nvml.h>
#pragma GCC visibility pop

#include "fakenvml.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- state -- */

struct nvmlDevice_st {
    char unused;
};

static struct nvmlDevice_st g_gpu_h[FK_MAX_GPUS];
static struct nvmlDevice_st g_mig_h[FK_MAX_GPUS][FK_MAX_MIG];

typedef struct {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtim;
    char path[PATH_MAX];
} fk_file_key;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static fk_config *g_cfg;      /* the last good device file */
static fk_file_key g_cfg_key; /* what g_cfg was read from */
static fk_file_key g_bad_key; /* last file that failed to parse (reported once) */
static unsigned int g_refcount;

/* A child forked while another thread held the lock must not inherit it held. */
static void fork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void fork_release(void) { pthread_mutex_unlock(&g_lock); }

__attribute__((constructor)) static void fakenvml_load(void)
{
    pthread_atfork(fork_prepare, fork_release, fork_release);
}

static int same_key(const fk_file_key *a, const fk_file_key *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtim.tv_sec == b->mtim.tv_sec &&
           a->mtim.tv_nsec == b->mtim.tv_nsec && strcmp(a->path, b->path) == 0;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (len < cap)
            break;
        char *bigger = realloc(buf, cap * 2 + 1);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (buf && bad) {
        free(buf);
        return NULL;
    }
    if (buf)
        buf[len] = '\0';
    return buf;
}

/*
 * Brings g_cfg up to date with FAKENVML_CONFIG. Caller holds g_lock.
 * at_init: the driver must be there now (unreadable -> DRIVER_NOT_LOADED,
 * unparsable -> UNKNOWN). Otherwise a vanished or broken file keeps the last
 * good state, as a loaded driver would.
 */
static nvmlReturn_t load_config(int at_init)
{
    nvmlReturn_t missing = (at_init || !g_cfg) ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_SUCCESS;
    const char *path = getenv("FAKENVML_CONFIG");
    struct stat st;
    fk_file_key key;

    if (!path || !*path || strlen(path) >= sizeof key.path || stat(path, &st) != 0)
        return missing;
    memset(&key, 0, sizeof key);
    key.dev = st.st_dev;
    key.ino = st.st_ino;
    key.size = st.st_size;
    key.mtim = st.st_mtim;
    strcpy(key.path, path);
    if (g_cfg && same_key(&key, &g_cfg_key))
        return NVML_SUCCESS;
    if (same_key(&key, &g_bad_key))
        return at_init ? NVML_ERROR_UNKNOWN : (g_cfg ? NVML_SUCCESS : NVML_ERROR_UNKNOWN);

    char *text = read_file(path);
    if (!text)
        return missing;
    char err[256];
    fk_config *cfg = fk_config_parse(text, err, sizeof err);
    free(text);
    if (!cfg) {
        fprintf(stderr, "fakenvml: %s: %s\n", path, err);
        g_bad_key = key;
        return at_init ? NVML_ERROR_UNKNOWN : (g_cfg ? NVML_SUCCESS : NVML_ERROR_UNKNOWN);
    }
    free(g_cfg);
    g_cfg = cfg;
    g_cfg_key = key;
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t rc)
{
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* Locks; checks init, reloads, applies library faults. Unlocks on failure. */
static nvmlReturn_t enter(const char *fn)
{
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    load_config(0);
    nvmlReturn_t rc = fk_fault_lookup(&g_cfg->faults, fn);
    return rc ? leave(rc) : NVML_SUCCESS;
}

/* For the few functions nvml.h documents as working before nvmlInit. */
static void enter_no_init(void)
{
    pthread_mutex_lock(&g_lock);
    load_config(0);
}

typedef struct {
    fk_gpu *g;
    fk_mig *m; /* NULL for a GPU handle */
    unsigned int gslot;
} fk_ctx;

static nvmlReturn_t device_faults(const fk_gpu *g, const fk_mig *m, const char *fn)
{
    nvmlReturn_t rc = m ? fk_fault_lookup(&m->faults, fn) : NVML_SUCCESS;
    return rc ? rc : fk_fault_lookup(&g->faults, fn);
}

/* A new handle: the device's faults, then whether the caller may open its node (node.c). */
static nvmlReturn_t handle_check(const fk_gpu *g, const fk_mig *m, const char *fn)
{
    nvmlReturn_t rc = device_faults(g, m, fn);
    return rc ? rc : fk_node_access(g);
}

static nvmlReturn_t resolve(nvmlDevice_t device, fk_ctx *c)
{
    uintptr_t p = (uintptr_t)device;
    uintptr_t g0 = (uintptr_t)&g_gpu_h[0], g1 = (uintptr_t)&g_gpu_h[FK_MAX_GPUS];
    uintptr_t m0 = (uintptr_t)&g_mig_h[0][0], m1 = m0 + sizeof g_mig_h;
    if (p >= g0 && p < g1) {
        c->gslot = (unsigned)((p - g0) / sizeof(struct nvmlDevice_st));
        c->m = NULL;
    } else if (p >= m0 && p < m1) {
        unsigned idx = (unsigned)((p - m0) / sizeof(struct nvmlDevice_st));
        c->gslot = idx / FK_MAX_MIG;
        unsigned mslot = idx % FK_MAX_MIG;
        if ((int)c->gslot < g_cfg->ngpus && g_cfg->gpu[c->gslot].visible) {
            fk_gpu *g = &g_cfg->gpu[c->gslot];
            /* A destroyed MIG device leaves an invalid handle, as documented. */
            if (!mig_enabled(g) || (int)mslot >= g->nmig || !g->mig[mslot].visible)
                return NVML_ERROR_INVALID_ARGUMENT;
            c->m = &g->mig[mslot];
        }
    } else {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if ((int)c->gslot >= g_cfg->ngpus || !g_cfg->gpu[c->gslot].visible)
        return NVML_ERROR_GPU_IS_LOST; /* the device went away since the handle was taken */
    c->g = &g_cfg->gpu[c->gslot];
    return NVML_SUCCESS;
}

/* enter() + handle lookup + the device's faults. Unlocks on failure. */
static nvmlReturn_t enter_device(const char *fn, nvmlDevice_t device, fk_ctx *c)
{
    nvmlReturn_t rc = enter(fn);
    if (rc)
        return rc;
    rc = resolve(device, c);
    if (!rc)
        rc = device_faults(c->g, c->m, fn);
    return rc ? leave(rc) : NVML_SUCCESS;
}

static nvmlReturn_t copy_str(char *dst, unsigned int length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(src);
    if ((size_t)length < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t fk_enter_lib(const char *fn)
{
    return enter(fn);
}

/* For tools.c: the same entry steps as the functions here. */
nvmlReturn_t fk_enter_device(const char *fn, nvmlDevice_t device, fk_dev *d)
{
    fk_ctx c;
    nvmlReturn_t rc = enter_device(fn, device, &c);
    if (!rc) {
        d->g = c.g;
        d->m = c.m;
    }
    return rc;
}

nvmlReturn_t fk_leave(nvmlReturn_t rc)
{
    return leave(rc);
}

nvmlReturn_t fk_resolve_other(const char *fn, nvmlDevice_t device, fk_dev *d)
{
    fk_ctx c;
    nvmlReturn_t rc = resolve(device, &c);
    if (!rc)
        rc = device_faults(c.g, c.m, fn);
    if (!rc) {
        d->g = c.g;
        d->m = c.m;
    }
    return rc;
}

const fk_config *fk_current(void)
{
    return g_cfg;
}

/* ----------------------------------------------------- init / shutdown -- */

static nvmlReturn_t init_common(const char *fn, unsigned int flags)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = load_config(1);
    if (!rc) {
        fk_config_apply_visibility(g_cfg); /* the visibility variables may have changed */
        rc = fk_fault_lookup(&g_cfg->faults, fn);
    }
    /* A host whose driver sees no GPU fails init unless told not to; a container
     * without mounted GPUs initialises and counts none. */
    if (!rc && g_cfg->nvis == 0 && !fk_container_mode(g_cfg) && !(flags & NVML_INIT_FLAG_NO_GPUS))
        rc = NVML_ERROR_GPU_NOT_FOUND;
    if (!rc)
        g_refcount++;
    return leave(rc);
}

nvmlReturn_t nvmlInit_v2(void)
{
    FK_COUNT();
    return init_common(__func__, 0);
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    FK_COUNT();
    return init_common(__func__, flags);
}

nvmlReturn_t nvmlShutdown(void)
{
    FK_COUNT();
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    load_config(0);
    nvmlReturn_t rc = fk_fault_lookup(&g_cfg->faults, __func__);
    if (!rc)
        g_refcount--;
    return leave(rc);
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    FK_COUNT();
    return fk_error_string(result);
}

/* --------------------------------------------------------------- system -- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    FK_COUNT();
    nvmlReturn_t rc = enter(__func__);
    if (rc)
        return rc;
    return leave(copy_str(version, length, g_cfg->driver_version));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    FK_COUNT();
    enter_no_init();
    nvmlReturn_t rc = g_cfg ? fk_fault_lookup(&g_cfg->faults, __func__) : NVML_SUCCESS;
    if (rc)
        return leave(rc);
    return leave(copy_str(version, length, g_cfg ? g_cfg->nvml_version : FK_DEFAULT_NVML_VERSION));
}

/* Needs nvmlInit, like the driver version: driver 580 answers UNINITIALIZED to both calls before it
   (tests/fakenvml/recorded/h100.json), although nvml.h lists no such error for them. */
static nvmlReturn_t cuda_version(const char *fn, int *out, int v2)
{
    nvmlReturn_t rc = enter(fn);
    if (rc)
        return rc;
    if (!out)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (g_cfg->has_cuda_version) {
        *out = g_cfg->cuda_version;
        return leave(NVML_SUCCESS);
    }
    /* No libcuda: _v2 says so, v1 answers a version it supports. */
    if (v2)
        return leave(NVML_ERROR_LIBRARY_NOT_FOUND);
    *out = FK_DEFAULT_CUDA_VERSION;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    FK_COUNT();
    return cuda_version(__func__, cudaDriverVersion, 0);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    FK_COUNT();
    return cuda_version(__func__, cudaDriverVersion, 1);
}

/* ------------------------------------------------------------- handles -- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    FK_COUNT();
    nvmlReturn_t rc = enter(__func__);
    if (rc)
        return rc;
    if (!deviceCount)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *deviceCount = g_cfg->nvis;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    FK_COUNT();
    nvmlReturn_t rc = enter(__func__);
    if (rc)
        return rc;
    if (!device || index >= g_cfg->nvis)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned slot = g_cfg->vis[index];
    rc = handle_check(&g_cfg->gpu[slot], NULL, __func__);
    if (!rc)
        *device = &g_gpu_h[slot];
    return leave(rc);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    FK_COUNT();
    nvmlReturn_t rc = enter(__func__);
    if (rc)
        return rc;
    if (!uuid || !*uuid || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned v = 0; v < g_cfg->nvis; v++) {
        unsigned slot = g_cfg->vis[v];
        fk_gpu *g = &g_cfg->gpu[slot];
        if (strcasecmp(g->uuid, uuid) == 0) {
            rc = handle_check(g, NULL, __func__);
            if (!rc)
                *device = &g_gpu_h[slot];
            return leave(rc);
        }
        for (int m = 0; m < g->nmig && mig_enabled(g); m++) {
            if (g->mig[m].visible && strcasecmp(g->mig[m].uuid, uuid) == 0) {
                rc = handle_check(g, &g->mig[m], __func__);
                if (!rc)
                    *device = &g_mig_h[slot][m];
                return leave(rc);
            }
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    FK_COUNT();
    nvmlReturn_t rc = enter(__func__);
    if (rc)
        return rc;
    unsigned dom, bus, dev;
    if (!pciBusId || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    int n = sscanf(pciBusId, "%x:%x:%x", &dom, &bus, &dev);
    if (n == 2) { /* bus:device.function without a domain */
        dev = bus;
        bus = dom;
        dom = 0;
    } else if (n != 3) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    for (unsigned v = 0; v < g_cfg->nvis; v++) {
        unsigned slot = g_cfg->vis[v];
        fk_gpu *g = &g_cfg->gpu[slot];
        if (g->pci_domain == dom && g->pci_bus == bus && g->pci_device == dev) {
            rc = handle_check(g, NULL, __func__);
            if (!rc)
                *device = &g_gpu_h[slot];
            return leave(rc);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

/* ------------------------------------------------------------ identity -- */

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!index)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = c.m ? c.m->vis_index : c.g->vis_index;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    return leave(copy_str(uuid, length, c.m ? c.m->uuid : c.g->uuid));
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    return leave(copy_str(name, length, c.m ? c.m->name : c.g->name));
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!serial)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.m || !c.g->has_serial)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    return leave(copy_str(serial, length, c.g->serial));
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!minorNumber)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.m)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *minorNumber = c.g->minor_number;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!type)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *type = c.g->brand;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!arch)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *arch = c.g->arch;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!major || !minor)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!c.g->has_cc)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *major = c.g->cc_major;
    *minor = c.g->cc_minor;
    return leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ pci -- */

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!pci)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    const fk_gpu *g = c.g; /* a MIG device answers its parent's PCI location */
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
             g->pci_domain & 0xffff, g->pci_bus, g->pci_device);
    pci->domain = g->pci_domain;
    pci->bus = g->pci_bus;
    pci->device = g->pci_device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    snprintf(pci->busId, sizeof pci->busId, "%s", g->pci_bus_id);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!pci)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (pci->version != nvmlPciInfoExt_v1)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    const fk_gpu *g = c.g;
    pci->domain = g->pci_domain;
    pci->bus = g->pci_bus;
    pci->device = g->pci_device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    pci->baseClass = g->pci_base_class;
    pci->subClass = g->pci_sub_class;
    memset(pci->busId, 0, sizeof pci->busId);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->pci_bus_id);
    return leave(NVML_SUCCESS);
}

/* --------------------------------------------------------------- memory -- */

static nvmlReturn_t memory_of(const fk_ctx *c, unsigned long long *total, unsigned long long *used,
                              unsigned long long *reserved)
{
    int has = c->m ? c->m->has_memory : c->g->has_memory;
    if (!has)
        return NVML_ERROR_NOT_SUPPORTED;
    *total = c->m ? c->m->memory_total : c->g->memory_total;
    *used = c->m ? c->m->memory_used : c->g->memory_used;
    *reserved = c->m ? c->m->memory_reserved : c->g->memory_reserved;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    FK_COUNT();
    fk_ctx c;
    unsigned long long total, used, reserved;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!memory)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    rc = memory_of(&c, &total, &used, &reserved);
    if (rc)
        return leave(rc);
    /* v1: used includes what the driver reserves. */
    memory->total = total;
    memory->used = used + reserved;
    memory->free = total > used + reserved ? total - used - reserved : 0;
    return leave(NVML_SUCCESS);
}

#ifndef FK_WITHOUT_MEMORY_V2 /* build.sh --without-memory-v2: a driver before 510 */
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    FK_COUNT();
    fk_ctx c;
    unsigned long long total, used, reserved;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!memory)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* Any other version: FUNCTION_NOT_FOUND, as driver 580 answers (recorded); the other versioned
       structs (temperature, PCI info) answer ARGUMENT_VERSION_MISMATCH there, as here. */
    if (memory->version != nvmlMemory_v2)
        return leave(NVML_ERROR_FUNCTION_NOT_FOUND);
    rc = memory_of(&c, &total, &used, &reserved);
    if (rc)
        return leave(rc);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total > used + reserved ? total - used - reserved : 0;
    return leave(NVML_SUCCESS);
}
#endif

/* -------------------------------------------------- sensors and limits -- */

/* Reads a plain unsigned value of the GPU; MIG handles have none of these. */
#define FK_GPU_VALUE(has_field, value_field)                                                                  \
    do {                                                                                                      \
        fk_ctx c;                                                                                             \
        nvmlReturn_t rc = enter_device(__func__, device, &c);                                                 \
        if (rc)                                                                                               \
            return rc;                                                                                        \
        if (!out)                                                                                             \
            return leave(NVML_ERROR_INVALID_ARGUMENT);                                                        \
        if (c.m || !c.g->has_field)                                                                           \
            return leave(NVML_ERROR_NOT_SUPPORTED);                                                           \
        *out = c.g->value_field;                                                                              \
        return leave(NVML_SUCCESS);                                                                           \
    } while (0)

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *out)
{
    FK_COUNT();
    FK_GPU_VALUE(has_power_usage, power_usage);
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *out)
{
    FK_COUNT();
    FK_GPU_VALUE(has_power_limit, power_limit);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *out)
{
    FK_COUNT();
    FK_GPU_VALUE(has_enforced_limit, enforced_limit);
}

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *out)
{
    FK_COUNT();
    FK_GPU_VALUE(has_fan, fan);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!utilization)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* Neither a MIG device nor a GPU in MIG mode reports utilisation. */
    if (c.m || mig_enabled(c.g) || !c.g->has_util)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    utilization->gpu = c.g->util_gpu;
    utilization->memory = c.g->util_memory;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t temperature(const fk_ctx *c, unsigned int sensor, unsigned int *out)
{
    if (sensor >= NVML_TEMPERATURE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (c->m)
        return NVML_ERROR_NOT_SUPPORTED;
    if (sensor == NVML_TEMPERATURE_GPU && c->g->has_temp) {
        *out = c->g->temp;
        return NVML_SUCCESS;
    }
    if (sensor == NVML_TEMPERATURE_GPU_MAX && c->g->has_temp_max) {
        *out = c->g->temp_max;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!temp)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(temperature(&c, (unsigned)sensorType, temp));
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temp)
{
    FK_COUNT();
    fk_ctx c;
    unsigned int value = 0;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!temp)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (temp->version != nvmlTemperature_v1)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    rc = temperature(&c, (unsigned)temp->sensorType, &value);
    if (!rc)
        temp->temperature = (int)value;
    return leave(rc);
}

static nvmlReturn_t clock_info(const char *fn, nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock,
                               int max)
{
    fk_ctx c;
    nvmlReturn_t rc = enter_device(fn, device, &c);
    if (rc)
        return rc;
    if (!clock)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* An unknown clock type: driver 580 answers NOT_SUPPORTED for the current clock and
       INVALID_ARGUMENT for the maximum (recorded, types 4, 5, 17, 1000). */
    if ((unsigned)type >= NVML_CLOCK_COUNT)
        return leave(max ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED);
    const int *has = max ? c.g->has_max_clock : c.g->has_clock;
    const unsigned int *val = max ? c.g->max_clock : c.g->clock;
    if (c.m || !has[type])
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *clock = val[type];
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    FK_COUNT();
    return clock_info(__func__, device, type, clock, 0);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    FK_COUNT();
    return clock_info(__func__, device, type, clock, 1);
}

/* ------------------------------------------------------------------ MIG -- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!currentMode || !pendingMode || c.m)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!c.g->mig_supported)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *currentMode = c.g->mig_mode;
    *pendingMode = c.g->mig_pending;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!count || c.m)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = mig_enabled(c.g) ? c.g->max_mig : 0; /* zero when MIG is unsupported or disabled */
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!migDevice || c.m)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!c.g->mig_supported)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!mig_enabled(c.g))
        return leave(NVML_ERROR_NOT_FOUND); /* driver 580, MIG disabled: any index (recorded) */
    if (index >= c.g->max_mig)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int m = 0; m < c.g->nmig; m++) {
        fk_mig *mg = &c.g->mig[m];
        if (mg->visible && mg->vis_index == index) {
            rc = fk_fault_lookup(&mg->faults, __func__);
            if (!rc)
                *migDevice = &g_mig_h[c.gslot][m];
            return leave(rc);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, device, &c);
    if (rc)
        return rc;
    if (!isMigDevice)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *isMigDevice = c.m != NULL;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    FK_COUNT();
    fk_ctx c;
    nvmlReturn_t rc = enter_device(__func__, migDevice, &c);
    if (rc)
        return rc;
    if (!device || !c.m)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &g_gpu_h[c.gslot];
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t instance_id(const char *fn, nvmlDevice_t device, unsigned int *id, int compute)
{
    fk_ctx c;
    nvmlReturn_t rc = enter_device(fn, device, &c);
    if (rc)
        return rc;
    if (!id)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!c.m)
        return leave(c.g->mig_supported ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED);
    *id = compute ? c.m->compute_instance_id : c.m->gpu_instance_id;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    FK_COUNT();
    return instance_id(__func__, device, id, 0);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    FK_COUNT();
    return instance_id(__func__, device, id, 1);
}

/* ------------------------------------------------------------ processes -- */

static nvmlReturn_t running_processes(const char *fn, nvmlDevice_t device, unsigned int *infoCount,
                                      nvmlProcessInfo_t *infos, int graphics)
{
    static fk_proc list[FK_MAX_PROCS + FK_MAX_MIG * FK_MAX_MIG_PROCS]; /* used under g_lock only */
    fk_ctx c;
    unsigned n = 0;
    nvmlReturn_t rc = enter_device(fn, device, &c);
    if (rc)
        return rc;
    if (!infoCount)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.m) {
        for (int i = 0; !graphics && i < c.m->nprocs; i++)
            list[n++] = c.m->procs[i];
    } else if (graphics) {
        for (int i = 0; i < c.g->ngprocs; i++)
            list[n++] = c.g->gprocs[i];
    } else {
        /* A GPU answers for itself and, in MIG mode, for its (visible) MIG devices. */
        for (int i = 0; i < c.g->nprocs; i++)
            list[n++] = c.g->procs[i];
        for (int m = 0; mig_enabled(c.g) && m < c.g->nmig; m++)
            for (int i = 0; c.g->mig[m].visible && i < c.g->mig[m].nprocs; i++)
                list[n++] = c.g->mig[m].procs[i];
    }
    if (*infoCount < n) {
        *infoCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (n > 0 && !infos)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned i = 0; i < n; i++) {
        infos[i].pid = list[i].pid;
        infos[i].usedGpuMemory = list[i].used_memory;
        infos[i].gpuInstanceId = list[i].gpu_instance_id;
        infos[i].computeInstanceId = list[i].compute_instance_id;
    }
    *infoCount = n;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    FK_COUNT();
    return running_processes(__func__, device, infoCount, infos, 0);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    FK_COUNT();
    return running_processes(__func__, device, infoCount, infos, 1);
}
