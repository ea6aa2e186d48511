// Gloo's generated configuration, for building against a LibTorch that ships no Gloo headers
// (PyTorch's pip wheels) from a checkout of Gloo's sources, which have only config.h.in: copied
// into the build folder by src/loco/comm/CMakeLists.txt when LOCO_GLOO_INCLUDE_DIR has no
// gloo/config.h. TCP transport, as PyTorch's Gloo; loco compiles only declarations from Gloo's
// headers (c10d's ProcessGroupGloo.hpp), the code is LibTorch's.
#pragma once
#define GLOO_VERSION_MAJOR 0
#define GLOO_VERSION_MINOR 5
#define GLOO_VERSION_PATCH 0
#define GLOO_VERSION (GLOO_VERSION_MAJOR * 10000 + GLOO_VERSION_MINOR * 100 + GLOO_VERSION_PATCH)
#define GLOO_USE_CUDA 0
#define GLOO_USE_NCCL 0
#define GLOO_USE_ROCM 0
#define GLOO_USE_RCCL 0
#define GLOO_USE_REDIS 0
#define GLOO_USE_IBVERBS 0
#define GLOO_USE_MPI 0
#define GLOO_USE_AVX 0
#define GLOO_USE_LIBUV 0
#define GLOO_HAVE_TRANSPORT_TCP 1
#define GLOO_HAVE_TRANSPORT_TCP_TLS 0
#define GLOO_HAVE_TRANSPORT_IBVERBS 0
#define GLOO_HAVE_TRANSPORT_UV 0
#define GLOO_USE_TORCH_DTYPES 1
