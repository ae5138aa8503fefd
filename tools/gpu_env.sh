# Sourced by the GPU scripts (tools/gpu_check.sh, tools/gpu_session.sh): puts the shared libraries
# the binaries need on LD_LIBRARY_PATH. gpu_env_libs LIBS_TAR: the tarball's libraries (for a GPU
# machine that is not Debian; empty: none), unpacked into a temporary folder; then the CUDA
# toolkit's cuBLAS where it is installed.
gpu_env_libs() {
  if [[ -n ${1:-} ]]; then
    local libdir
    libdir=$(mktemp -d)
    tar -xJf "$1" -C "$libdir"
    export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -e $d/libcublas.so.13 ]] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
  done
  return 0
}
