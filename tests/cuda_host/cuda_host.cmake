# The CUDA engine built for the host (docs/CUDA.md "The engine on the host"):
# the engine's own sources (cuda_engine, the tensor-parallel and ZeRO-1 device
# code, the NCCL communicator, matmul.cu, device.cu) compiled against the
# toolkit's headers as host C++, every kernel file turned by
# tests/simt/gen.py --launchers into host C++ whose launches run the kernel
# under the SIMT emulator, and the host CUDA shim (tests/cuda_host/shim)
# providing the CUDA runtime, cuBLASLt and NCCL symbols. Included from the
# top-level CMakeLists.txt when KVS_CUDA is on (the toolkit's headers are needed).
#
# The shim defines cudaMalloc, cublasLtMatmul, ncclAllReduce... itself, so the
# binaries below must not run the real libraries: the host engine is an
# OBJECT library (all of it linked before kvs_lib, whose CUDA objects and
# libkvs_cuda.a members are then never pulled in), and --as-needed drops the
# toolkit's shared libraries kvs_lib names; HostCuda.NoCudaLibraryIsLoaded checks it.
# libstdc++ comes before the archives: a static library later on the line
# (libgtest.a) needs standard-library template instantiations that a
# libkvs_cuda.a member also happens to emit, and must not pull that member
# (cudnn_sdpa.cpp.o, with cuDNN and NVRTC behind it) in for them.

set(KVS_HOST_GEN_DIR ${CMAKE_BINARY_DIR}/cuda_host_gen)
set(KVS_HOST_GEN_SOURCES)
foreach(_k ${KVS_SIMT_KERNELS})
  string(REGEX REPLACE "\\.cu$" ".cpp" _c "host_${_k}")
  list(APPEND KVS_HOST_GEN_SOURCES ${KVS_HOST_GEN_DIR}/${_c})
endforeach()
add_custom_command(
  OUTPUT ${KVS_HOST_GEN_SOURCES}
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/simt/gen.py --launchers ${CMAKE_SOURCE_DIR}/src/kernels/cuda
          ${KVS_HOST_GEN_DIR} ${KVS_SIMT_KERNELS}
  COMMAND ${CMAKE_COMMAND} -E touch ${KVS_HOST_GEN_SOURCES}
  DEPENDS ${CMAKE_SOURCE_DIR}/tests/simt/gen.py ${KVS_SIMT_KERNEL_PATHS} ${KVS_SIMT_CUH}
  COMMENT "tests/simt/gen.py --launchers: CUDA kernels and launchers -> host C++ for the host engine"
  VERBATIM)

# matmul.cu and device.cu are host code already: compiled as C++ through a wrapper
# (a LANGUAGE property on the .cu files would change them for kvs_cuda too).
set(KVS_HOST_WRAPPERS)
foreach(_f matmul device)
  set(_w ${KVS_HOST_GEN_DIR}/wrap_${_f}.cpp)
  file(GENERATE OUTPUT ${_w} CONTENT "#include \"${CMAKE_SOURCE_DIR}/src/kernels/cuda/${_f}.cu\"\n")
  list(APPEND KVS_HOST_WRAPPERS ${_w})
endforeach()

file(GLOB KVS_HOST_SHIM_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda_host/shim/*.cpp)
add_library(kvs_cuda_host OBJECT
  ${KVS_HOST_GEN_SOURCES} ${KVS_HOST_WRAPPERS} ${KVS_HOST_SHIM_SOURCES}
  ${CMAKE_SOURCE_DIR}/src/model/cuda_engine.cpp
  ${CMAKE_SOURCE_DIR}/src/model/cuda_engine_cp.cpp
  ${CMAKE_SOURCE_DIR}/src/parallel/cuda_cp_exchange.cpp
  ${CMAKE_SOURCE_DIR}/src/model/cuda_engine_stage.cpp
  ${CMAKE_SOURCE_DIR}/src/parallel/tied_embedding.cpp
  ${CMAKE_SOURCE_DIR}/src/parallel/cuda_linear.cpp
  ${CMAKE_SOURCE_DIR}/src/parallel/cuda_tp_region.cpp
  ${CMAKE_SOURCE_DIR}/src/parallel/zero1_device.cpp
  ${CMAKE_SOURCE_DIR}/src/dist/nccl_comm.cpp
  ${CMAKE_SOURCE_DIR}/src/dist/gpu_device.cpp
  ${CMAKE_SOURCE_DIR}/src/kernels/cuda/attention_backend.cpp
  ${CMAKE_SOURCE_DIR}/src/kernels/cuda/flash_hopper_check.cpp
  ${CMAKE_SOURCE_DIR}/src/kernels/cuda/kernel_profile.cpp)
target_include_directories(kvs_cuda_host PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests/cuda_host/shim
                           ${CMAKE_SOURCE_DIR}/tests/simt ${KVS_HOST_GEN_DIR})
target_include_directories(kvs_cuda_host SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS} ${KVS_NCCL_INCLUDE})
# KVS_CUDA as in kvs_lib; no KVS_CUDNN (the cuDNN backend is out of scope: "cudnn" is refused).
# KVS_CUDA_SM90A: the host build has the Hopper forward (its kernel under the emulator; the shim is a 9.0 device).
target_compile_definitions(kvs_cuda_host PRIVATE KVS_CUDA=1 KVS_CUDA_SM90A=1)
# (-Wno-restrict: GCC 12's false positive on std::string concatenation;
# -Wno-psabi: as for kvs_lib, the CPU kernels' 64-byte vectors without AVX-512.)
target_compile_options(kvs_cuda_host PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-restrict -Wno-psabi)
# The same OpenMP flag as kvs_lib: the engine includes the CPU ops' inline functions.
target_link_libraries(kvs_cuda_host PUBLIC OpenMP::OpenMP_CXX spdlog::spdlog nlohmann_json::nlohmann_json MPI::MPI_CXX)
# The kernels as tests/simt translates them (no FMA contraction), plus every
# load and store calling the shim's checks (memory.cpp's __asan_*_noabort hooks;
# no sanitizer runtime is linked). At -O0: when optimising, GCC instruments a
# memory reference once per basic block, so the store of `y[i] += x` would
# reach the shim as its load only, and a race on it would go unseen
# (docs/CUDA.md "The engine on the host"; about 1.5x the time of -O1).
set_source_files_properties(${KVS_HOST_GEN_SOURCES} PROPERTIES COMPILE_OPTIONS
  "-O0;-ffp-contract=off;-w;-fsanitize=kernel-address;--param=asan-instrumentation-with-call-threshold=0;--param=asan-stack=0;--param=asan-globals=0")

# The kernels that break the rules on purpose (the planted-misuse tests), translated like the engine's.
set(KVS_HOST_PLANTED ${KVS_HOST_GEN_DIR}/host_planted.cpp)
add_custom_command(
  OUTPUT ${KVS_HOST_PLANTED}
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/simt/gen.py --launchers
          ${CMAKE_SOURCE_DIR}/tests/cuda_host/planted ${KVS_HOST_GEN_DIR} planted.cu
  COMMAND ${CMAKE_COMMAND} -E touch ${KVS_HOST_PLANTED}
  DEPENDS ${CMAKE_SOURCE_DIR}/tests/simt/gen.py ${CMAKE_SOURCE_DIR}/tests/cuda_host/planted/planted.cu
  VERBATIM)
set_source_files_properties(${KVS_HOST_PLANTED} PROPERTIES COMPILE_OPTIONS
  "-O1;-w;-fsanitize=kernel-address;--param=asan-instrumentation-with-call-threshold=0;--param=asan-stack=0;--param=asan-globals=0")

# The tests: tests/cuda_host/test_*.cpp in one binary, mpi_*.cpp under mpirun.
file(GLOB KVS_HOST_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda_host/test_*.cpp)
add_executable(kvshift_cuda_host ${KVS_HOST_TEST_SOURCES} ${KVS_HOST_PLANTED})
target_include_directories(kvshift_cuda_host PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/tests/cuda_host/shim
                           ${CMAKE_SOURCE_DIR}/tests/cuda_host/planted ${CMAKE_SOURCE_DIR}/tests/simt)
target_link_libraries(kvshift_cuda_host PRIVATE kvs_cuda_host stdc++ kvs_lib GTest::gtest GTest::gtest_main)
target_link_options(kvshift_cuda_host PRIVATE -Wl,--as-needed)
kvs_add_test_paths(kvshift_cuda_host kvshift)
gtest_discover_tests(kvshift_cuda_host DISCOVERY_TIMEOUT 60 PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2" TIMEOUT 300)

file(GLOB KVS_HOST_MPI_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda_host/mpi_*.cpp)
if(KVS_HOST_MPI_SOURCES)
  add_executable(kvshift_cuda_host_mpi ${KVS_HOST_MPI_SOURCES} ${CMAKE_SOURCE_DIR}/tests/parallel/mpi_main.cpp)
  target_include_directories(kvshift_cuda_host_mpi PRIVATE ${CMAKE_SOURCE_DIR}/tests
                             ${CMAKE_SOURCE_DIR}/tests/cuda_host/shim)
  target_link_libraries(kvshift_cuda_host_mpi PRIVATE kvs_cuda_host stdc++ kvs_lib GTest::gtest)
  target_link_options(kvshift_cuda_host_mpi PRIVATE -Wl,--as-needed)
  add_test(NAME cuda_host_mpi_np2
    COMMAND ${CMAKE_COMMAND} -E env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
            OMPI_MCA_btl_vader_single_copy_mechanism=none KVS_SHIM_NCCL_RENDEZVOUS=1
            ${KVS_MPIRUN} --oversubscribe --bind-to none -np 2 $<TARGET_FILE:kvshift_cuda_host_mpi>)
  set_tests_properties(cuda_host_mpi_np2 PROPERTIES TIMEOUT 300)
  # Pipeline stages combined with dp, cp or tp + SP, and dp x cp, need 2 x 2 ranks (the other tests skip at 4).
  add_test(NAME cuda_host_mpi_np4
    COMMAND ${CMAKE_COMMAND} -E env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
            OMPI_MCA_btl_vader_single_copy_mechanism=none KVS_SHIM_NCCL_RENDEZVOUS=1
            ${KVS_MPIRUN} --oversubscribe --bind-to none -np 4 $<TARGET_FILE:kvshift_cuda_host_mpi>
            --gtest_filter=HostCudaPipelineWithParallel.*:HostCudaParallelFourRanks.*)
  set_tests_properties(cuda_host_mpi_np4 PROPERTIES TIMEOUT 300)
endif()

# The GPU tests themselves (tests/**/test_cuda_*.cpp, tests/kernels/cuda/) on the
# host build, with the CLI built the same way as their kvs::test::cli_binary() (their
# multi-process tests run `kvshift train` under mpirun). ctest runs the ones that
# fit CI's time; docs/CUDA.md says which are left out and why.
file(GLOB_RECURSE KVS_HOST_GPU_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/*/test_cuda_*.cpp
     ${CMAKE_SOURCE_DIR}/tests/kernels/cuda/test_*.cpp)
add_executable(kvshift_host ${CMAKE_SOURCE_DIR}/src/cli/main.cpp)
target_link_libraries(kvshift_host PRIVATE kvs_cuda_host stdc++ kvs_lib)
target_link_options(kvshift_host PRIVATE -Wl,--as-needed)
add_executable(kvshift_cuda_host_gpu_tests ${KVS_HOST_GPU_TEST_SOURCES})
target_include_directories(kvshift_cuda_host_gpu_tests PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/tests/parallel)
target_link_libraries(kvshift_cuda_host_gpu_tests PRIVATE kvs_cuda_host stdc++ kvs_lib GTest::gtest GTest::gtest_main)
target_link_options(kvshift_cuda_host_gpu_tests PRIVATE -Wl,--as-needed)
target_compile_definitions(kvshift_cuda_host_gpu_tests PRIVATE KVS_CUDA_SM90A=1)
kvs_add_test_paths(kvshift_cuda_host_gpu_tests kvshift_host)
add_dependencies(kvshift_cuda_host_gpu_tests kvshift_host)
# Left out: the flash attention tests (40 s here; tests/simt runs the same kernels),
# the 50- and 20-step training and multi-process runs (minutes). The emulator
# runs a kernel on one thread, so two shards at once (one thread each) take
# about half the time of one process.
add_test(NAME cuda_host_gpu_tests COMMAND bash ${CMAKE_SOURCE_DIR}/tests/run_gtest_shards.sh 2
  $<TARGET_FILE:kvshift_cuda_host_gpu_tests>
  "--gtest_filter=CudaAdamW.*:CudaRingAttention.*:CudaConvert.*:CudaCrossEntropy*:CudaEmbedding.*:CudaMatmul*:CudaReduce.*:CudaRmsNorm.*:CudaShiftRope.*:CudaSwiGLU.*:CudaTensorParallel.*:CudaZero1.*:CudaPipeline.*:CudaEngine.*:CudaCudnnSdpa.*:CudaHopperBlocks.*:CudaKernelProfile.*:CudaBench.*:CudaEval.*:-*Mpi*:*Nccl*:CudaEngine.FiftySteps*:CudaEngine.ResumeIsBitIdentical")
set_tests_properties(cuda_host_gpu_tests PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 300)
