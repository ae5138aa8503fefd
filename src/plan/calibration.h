// Calibration: a short measurement of this machine that the planner (`stratum plan`) uses to
// predict step time: sgemm throughput on training-shaped products, O_DIRECT read and write
// bandwidth of the offload directory's device through the project's IoEngine, and single-thread
// RAM bandwidth. Results are cached in a JSON file keyed by (device, cpu, BLAS, threads, disk
// test size), so a second run costs a stat() and a file read (Note [calibration cache]).
// Does not plan, set the BLAS thread count (the CLI does at start-up) or pick I/O settings: the
// disk is measured with IoEngine's default block size and queue depth, as the store uses them.
#pragma once

#include <cstddef>
#include <string>

namespace stratum {

struct Calibration {
  double gemm_gflops = 0;      // median sgemm throughput with `threads` BLAS threads, GFLOP/s (1e9 flop/s)
  double disk_read_gbps = 0;   // offload dir: O_DIRECT (when supported) reads, GB/s (1e9 bytes/s)
  double disk_write_gbps = 0;  // same for writes, including the final fsync
  double mem_gbps = 0;         // single-thread RAM bandwidth of an in-place elementwise loop
                               // (x = a*x + y over arrays >> cache), counting bytes read plus
                               // bytes written, GB/s: time ~ bytes touched / mem_gbps (AdamW etc.)
  int threads = 0;             // BLAS threads the GEMM number belongs to (CalibrationOptions::threads)
  std::string device;          // what the disk numbers belong to, e.g. "dev 254:0 (vda) ext4"
  std::string cpu;             // e.g. "AMD EPYC, 2 hardware threads" (/proc/cpuinfo model name)
  std::string blas;            // blas_describe() at measurement time, e.g. "OpenBLAS 0.3.21 (Zen, 2 threads)"
  bool disk_direct = false;    // the disk numbers are O_DIRECT (false: through the page cache, e.g. tmpfs)
  std::size_t disk_test_bytes = 0;  // size of the disk test file the numbers come from
  bool from_cache = false;     // loaded from the cache file instead of measured now
  std::string note;            // one line when something about the cache was off (a corrupt file
                               // ignored, the cache not writable), else empty; never an error
};

struct CalibrationOptions {
  std::string offload_dir;     // directory whose device is measured (must exist and be writable)
  int threads = 1;             // BLAS threads the caller set with blas_set_threads (part of the key)
  std::string cache_path;      // empty: calibration_default_cache_path()
  bool refresh = false;        // measure even when the cache has an entry, and replace it
  // Rounded up to 4 KiB; at most a quarter of the directory's free space (a smaller file gives
  // rough numbers, and says so in the note; below 1 MiB the disk is not measured: an error).
  std::size_t disk_test_bytes = std::size_t{256} << 20;
  std::size_t free_bytes_override = 0;  // tests: pretend the directory's device has this much free
  int gemm_time_ms = 400;      // about how long the GEMM measurement takes, its warm-up call included
};

// $STRATUM_CACHE_DIR, else $XDG_CACHE_HOME/stratum, else $HOME/.cache/stratum, followed by
// "/calibration.json" (unset and empty variables are skipped). Empty when none is set: then
// calibrate() does not cache.
std::string calibration_default_cache_path();

// The device key of `dir`: "dev MAJ:MIN (NAME) FSTYPE", NAME from /sys/dev/block/MAJ:MIN/uevent
// (left out when there is none, e.g. tmpfs), FSTYPE from statfs (ext4, xfs, btrfs, tmpfs, ... or
// "fs 0x<magic>"). Throws Error when `dir` is missing or not a directory.
std::string calibration_device(const std::string& dir);

// Returns the cached entry for (device of offload_dir, cpu, BLAS, threads, disk_test_bytes)
// unless options.refresh or there is none; otherwise measures (about 0.5 s plus the disk test)
// and stores the result in the cache. Throws Error (one line) when offload_dir is missing, not a
// directory, not writable or has no room for the test file; cache problems only set `note`.
Calibration calibrate(const CalibrationOptions& options);

// Note [stale plan directories]: the planner's files are named after the process that made them:
// directories stratum-plan-<pid> (the measurement's offload files) and stratum-plan-<pid>-XXXXXX
// (the measured config), and the disk test file .stratum-calibrate.<pid>.tmp. That process removes
// them when it is done; one killed outright (SIGKILL, or Ctrl-C reaching the measurement process,
// which has no handler) cannot. So before making one, and after a measurement process dies of a
// signal, the planner removes those in the same parent whose process no longer exists. A live
// process's, or one this user may not signal, are left alone.
void stale_planner_files_remove(const std::string& parent);

}  // namespace stratum
