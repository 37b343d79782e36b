/*
 * Internal declarations of the stand-in libnvidia-ml.so.1 (see README.md).
 *
 * The library is split in three parts:
 *   config.c  - reads the JSON device file (cJSON) into an fk_config, applies
 *               container visibility, maps NVML error names;
 *   counts.c  - per-function call counters in a shared, mmap'ed file;
 *   api.c     - the exported NVML functions (prototypes from the official nvml.h);
 *   tools.c   - the further NVML functions that monitoring tools (nvitop,
 *               gpustat, jupyterlab-nvdashboard) call, on top of api.c;
 *   topo.c    - topology: PCIe common ancestors, NVLink links and their peers,
 *               CPU and memory affinity (the "topology" keys).
 *
 * Everything here has hidden visibility (the build uses -fvisibility=hidden);
 * only the NVML entry points in api.c are exported.
 */
#ifndef FAKENVML_INTERNAL_H
#define FAKENVML_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <nvml.h>

#define FK_MAX_GPUS 64
#define FK_MAX_MIG 7
#define FK_MAX_PROCS 128
#define FK_MAX_MIG_PROCS 32
#define FK_MAX_FAULTS 32
#define FK_STR 96 /* NVML_DEVICE_UUID_V2_BUFFER_SIZE == NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define FK_FN_NAME 64
#define FK_PATH 256 /* device_node, pcie_path */
#define FK_MAX_NUMA 16
#define FK_CPU_WORDS 16 /* 1024 CPUs, 64 per unsigned long */
#define FK_CODEC_PERIOD_US 167000 /* encoder/decoder sampling period; an H100 on driver 580 says 100000 */
#define FK_PCIE_WINDOW_NS 20000000L /* nvmlDeviceGetPcieThroughput's 20 ms window */
#define FK_MAX_SWITCHES 8
#define FK_LINK_OFF (-1)           /* an NVLink link that is not active */
#define FK_LINK_SWITCH_BASE (-100) /* link to NVSwitch s: FK_LINK_SWITCH_BASE - s */

/* NVML_VALUE_NOT_AVAILABLE for the unsigned fields of nvmlProcessInfo_t. */
#define FK_NA_U32 0xFFFFFFFFu
#define FK_NA_U64 0xFFFFFFFFFFFFFFFFull

typedef struct {
    char fn[FK_FN_NAME]; /* function name, base name (no _vN) or "*" */
    nvmlReturn_t rc;
} fk_fault;

typedef struct {
    int n;
    fk_fault f[FK_MAX_FAULTS];
} fk_faults;

typedef struct {
    unsigned int pid;
    unsigned long long used_memory; /* FK_NA_U64 when the config says null */
    unsigned int gpu_instance_id;   /* FK_NA_U32 outside MIG */
    unsigned int compute_instance_id;
    /* per-process utilisation sample (tools.c); has_util 0: the process has none */
    int has_util;
    unsigned int sm_util, mem_util, enc_util, dec_util;
} fk_proc;

typedef struct {
    char uuid[FK_STR];
    char name[FK_STR];
    int has_memory;
    unsigned long long memory_total, memory_used, memory_reserved;
    unsigned int gpu_instance_id, compute_instance_id;
    int nprocs;
    fk_proc procs[FK_MAX_MIG_PROCS];
    fk_faults faults;
    /* derived by visibility */
    int visible;
    unsigned int vis_index;
} fk_mig;

enum { FK_CLK_GRAPHICS, FK_CLK_SM, FK_CLK_MEM, FK_CLK_VIDEO, FK_CLK_N };

/* What monitoring tools read beyond the basics (tools.c); has_* 0: NOT_SUPPORTED. */
typedef struct {
    int has_enc, has_dec;
    unsigned int enc_util, dec_util;
    unsigned int codec_period_us; /* the sampling period both report */

    int has_pcie_max_gen, has_pcie_max_width, has_pcie_gen, has_pcie_width, has_pcie_tx, has_pcie_rx;
    unsigned int pcie_max_gen, pcie_max_width, pcie_gen, pcie_width;
    unsigned int pcie_tx, pcie_rx; /* KB/s */

    int has_nvlink; /* "nvlink" present: links, version, speed */
    unsigned int nvlink_links, nvlink_version, nvlink_speed_mbps;
    unsigned long long nvlink_tx, nvlink_rx; /* KiB/s per link; counters grow at these rates */

    int has_persistence, has_display_mode, has_display_active, has_pstate, has_compute_mode;
    unsigned int persistence, display_mode, display_active, pstate, compute_mode;

    int has_ecc;
    unsigned long long ecc_corrected, ecc_uncorrected;

    int has_bar1;
    unsigned long long bar1_total, bar1_used;
} fk_tools;

/* Health (health.c): XID events raised so far (append to inject one) and row remapping. */
#define FK_MAX_XIDS 64
typedef struct {
    int nxid;
    unsigned long long xid[FK_MAX_XIDS];
    int has_remap;
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure;
} fk_health;

typedef struct {
    char uuid[FK_STR];
    char name[FK_STR];
    int has_serial;
    char serial[FK_STR];

    char pci_bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned int pci_domain, pci_bus, pci_device;
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned int pci_base_class, pci_sub_class;
    unsigned int minor_number;
    char device_node[FK_PATH]; /* "": none named (node.c) */

    int has_memory;
    unsigned long long memory_total, memory_used, memory_reserved;

    int has_cc;
    int cc_major, cc_minor;

    int has_util;
    unsigned int util_gpu, util_memory;

    int has_temp, has_temp_max;
    unsigned int temp, temp_max;

    int has_power_usage, has_power_limit, has_enforced_limit;
    unsigned int power_usage, power_limit, enforced_limit;

    int has_clock[FK_CLK_N], has_max_clock[FK_CLK_N];
    unsigned int clock[FK_CLK_N], max_clock[FK_CLK_N];

    int has_fan;
    unsigned int fan;

    nvmlBrandType_t brand;
    int has_arch;
    nvmlDeviceArchitecture_t arch;

    int mig_supported; /* "mig_mode" present and not null */
    unsigned int mig_mode, mig_pending;
    unsigned int max_mig;
    int nmig;
    fk_mig mig[FK_MAX_MIG];

    int nprocs;
    fk_proc procs[FK_MAX_PROCS];
    int ngprocs;
    fk_proc gprocs[FK_MAX_PROCS];

    fk_tools tools;
    fk_health health;

    /* topology (topo.c): the CPU-side NUMA node (-1: none, as on a host without NUMA),
     * the GPU's own NUMA node (coherent-memory platforms), the PCIe path
     * "hostbridge/switch/..." ("" unknown), and what each NVLink link reaches:
     * a peer GPU's host slot, FK_LINK_OFF or an NVSwitch. */
    int has_numa;
    int numa_node;
    int has_gpu_numa;
    unsigned int gpu_numa_node;
    char pcie_path[FK_PATH];
    int link_peer[NVML_NVLINK_MAX_LINKS];

    fk_faults faults;

    /* derived by visibility */
    int visible;
    unsigned int vis_index;
} fk_gpu;

typedef struct {
    char driver_version[FK_STR];
    char nvml_version[FK_STR];
    int has_cuda_version;
    int cuda_version;
    int container;
    fk_faults faults;
    /* topology: NUMA nodes (CPUs, socket) and NVSwitches (PCI location) */
    int nnuma;
    struct {
        unsigned long cpus[FK_CPU_WORDS];
        int socket;
    } numa[FK_MAX_NUMA];
    int nswitch;
    struct {
        char bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
        unsigned int domain, bus, device;
    } nvswitch[FK_MAX_SWITCHES];
    int ngpus;
    fk_gpu gpu[FK_MAX_GPUS];
    /* derived by visibility: host slots of the visible GPUs, in host order */
    unsigned int nvis;
    unsigned int vis[FK_MAX_GPUS];
} fk_config;

static inline int mig_enabled(const fk_gpu *g)
{
    return g->mig_supported && g->mig_mode == NVML_DEVICE_MIG_ENABLE;
}

/* config.c */
#define FK_DEFAULT_DRIVER_VERSION "550.54.15"
#define FK_DEFAULT_NVML_VERSION "12.550.54.15"
#define FK_DEFAULT_CUDA_VERSION 12040

/* Parses JSON text into a freshly allocated config (NULL + message on error). */
fk_config *fk_config_parse(const char *text, char *err, size_t errlen);
/* Applies container visibility (config flag / FAKENVML_CONTAINER + env lists). */
void fk_config_apply_visibility(fk_config *cfg);
/* Container mode: "container": true in the file, or FAKENVML_CONTAINER=1. */
int fk_container_mode(const fk_config *cfg);
/* Fault for a function: exact name, then name without _vN suffix, then "*". */
nvmlReturn_t fk_fault_lookup(const fk_faults *faults, const char *fn);
/* "NOT_SUPPORTED" / "NVML_ERROR_NOT_SUPPORTED" / number -> code; -1 if unknown. */
long fk_error_from_name(const char *name);
const char *fk_error_string(nvmlReturn_t rc);

/* node.c: may the caller open the GPU's device node? SUCCESS, NO_PERMISSION, NOT_FOUND */
nvmlReturn_t fk_node_access(const fk_gpu *g);

/* counts.c */
typedef struct fk_counter fk_counter;
/* Adds one to the counter of fn; *cache keeps the slot for the next call. */
void fk_count(const char *fn, fk_counter **cache);

/* Counts a call of the enclosing exported function (first line of each one). */
#define FK_COUNT()                                                                                            \
    do {                                                                                                      \
        static fk_counter *fk_slot_;                                                                          \
        fk_count(__func__, &fk_slot_);                                                                        \
    } while (0)

/* api.c, for the exported functions of other files (tools.c). */
typedef struct {
    fk_gpu *g;
    fk_mig *m; /* NULL for a GPU handle */
} fk_dev;
/* Locks, checks init, reloads, resolves the handle, applies faults; on success the
 * lock is held and the caller ends with fk_leave(rc). On failure it is released. */
nvmlReturn_t fk_enter_device(const char *fn, nvmlDevice_t device, fk_dev *d);
/* Releases the lock taken by fk_enter_device and returns rc. */
nvmlReturn_t fk_leave(nvmlReturn_t rc);
/* With the lock held (after fk_enter_device): a second handle, faults applied. */
nvmlReturn_t fk_resolve_other(const char *fn, nvmlDevice_t device, fk_dev *d);
/* The configuration in force (lock held). */
const fk_config *fk_current(void);

/* api.c: locks, checks init, reloads, applies library faults; unlocks on failure. */
nvmlReturn_t fk_enter_lib(const char *fn);

/* health.c: the device's "xid_events" and "remapped_rows" keys (0, or -1 and a message). */
struct cJSON;
int fk_health_parse(const struct cJSON *d, const char *where, fk_health *h, char *err, size_t errlen);

/* tools.c: seconds since the library was loaded (data counters grow from there). */
double fk_seconds_loaded(void);

#endif
