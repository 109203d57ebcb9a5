include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

kvlab_expect(RC 0 ARGS presets OUT "llama-2-70b +llama +80 +64 +8 +128 +GQA-8 +4096 +68.98 B" "stories15m +llama2.c +6 +6 +6 +48 +MHA +256 +15.19 M")
kvlab_expect(RC 0 ARGS presets --format json)
string(JSON n LENGTH "${KVLAB_OUT}" tables 0 rows)
if(n LESS 18)
  message(FATAL_ERROR "presets json lists ${n} presets; expected at least 18")
endif()

# Sources are public (a Hugging Face config, a paper, a repository), never a path outside the repository.
kvlab_expect(RC 0 ARGS presets --format csv OUT "https://huggingface.co/meta-llama/Llama-2-7b-hf" NOT_OUT "shared/")

# --gpus: the GPU presets kvcalc --gpu takes. H100 SXM: datasheet 80GB (= 80 GiB), nvidia-smi 81559 MiB
# = 79.65 GiB, 3.35 TB/s; FP16 dense 989.4 TFLOP/s (the datasheet's 1,979 sparse / 2).
kvlab_expect(RC 0 ARGS presets --gpus OUT "h100-sxm-80gb +NVIDIA H100 SXM 80GB +80.00 GiB +79.65 GiB +3.35 TB/s +989.4 TFLOP/s +h100")
# The A100 40GB's datasheet bandwidth is 1,555 GB/s: 1.555 TB/s, not the 1.55 a double's 1.55499... rounds to.
kvlab_expect(RC 0 ARGS presets --gpus OUT "a100-sxm-40gb +NVIDIA A100 SXM4 40GB +40.00 GiB +40.00 GiB +1.555 TB/s ")
kvlab_expect(RC 0 ARGS presets --gpus --format json)
string(JSON driver GET "${KVLAB_OUT}" tables 0 rows 0 driver_bytes)
if(NOT driver STREQUAL "85520809984")  # 81559 MiB x 2^20
  message(SEND_ERROR "presets --gpus json: driver_bytes ${driver}, expected 85520809984")
endif()
