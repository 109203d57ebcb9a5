// `kvlab gpu attention`: time one decode step of attention on a CUDA GPU, cached (read the KV cache)
// against uncached (recompute K and V with a GEMM), for MHA/GQA/MQA variants of one shape, with K and V
// contiguous or paged, in the dtype or fp8.
// Correctness against the CPU reference comes first; no timing is printed if any check fails.
#include <iostream>
#include <memory>
#include <string>

#include "commands.hpp"
#include "options.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/printer.hpp"
#include "gpu/gpu_attention_report.hpp"

namespace kvlab::cli {

namespace {

struct GpuCliOptions {
    GpuAttentionRequest request;
    Format format = Format::table;
};

}  // namespace

void setup_gpu(CLI::App& app) {
    CLI::App* gpu = app.add_subcommand("gpu", "Time KV-cache work on a CUDA GPU (needs a CUDA build and a device)");
    gpu->require_subcommand(1);
    auto opts = std::make_shared<GpuCliOptions>();
    GpuAttentionRequest* o = &opts->request;
    CLI::App* cmd = gpu->add_subcommand(
        "attention", "Time a decode attention step: cached (read K,V) vs uncached (recompute K,V), MHA/GQA/MQA");
    CLI::Option* model = input_file(cmd->add_option("--model", o->model, "Model preset or config.json for heads, KV heads, head dim, hidden"));
    cmd->add_option("--heads", o->n_head, "Query heads H (instead of --model)")->check(at_least(1))->excludes(model);
    cmd->add_option("--kv-heads", o->n_head_kv, "KV heads Hkv (default: --heads)")->check(at_least(1))->excludes(model);
    cmd->add_option("--head-dim", o->d_head, "Head dim D, a multiple of 8 up to 256")->check(at_least(1))->excludes(model);
    cmd->add_option("--hidden", o->d_model, "Hidden size d for the uncached K,V GEMM (default: H*D)")
        ->check(at_least(1))
        ->excludes(model);
    cmd->add_option("--batch", o->batch, "Batch sizes B, comma-separated")->capture_default_str();
    cmd->add_option("--context", o->context, "Context lengths T (cached tokens), comma-separated, e.g. 1k,8k")
        ->capture_default_str();
    cmd->add_option("--dtype", o->dtype, "Storage types: fp16, bf16 (comma-separated)")->capture_default_str();
    cmd->add_option("--attention", o->attention, "Variants side by side: native, mha, mqa, gqa:N (N KV heads)")
        ->capture_default_str();
    cmd->add_option("--kernel", o->kernel,
                    "Attention kernels side by side: auto, cuda-cores, tensor-cores (comma-separated; auto: tensor "
                    "cores for groups of 4+ query heads per KV head, head dim 64 or 128, compute capability 8.0+)")
        ->capture_default_str();
    cmd->add_option("--kv-layout", o->kv_layout,
                    "Where K and V live, side by side: contiguous, paged (a pool of blocks reached through a "
                    "shuffled block table; comma-separated)")
        ->capture_default_str();
    cmd->add_option("--block-order", o->block_order,
                    "Paged: shuffled (the block table a fragmented pool gives) or in-order (each sequence's blocks "
                    "in order, so only the lookups differ from contiguous)")
        ->capture_default_str();
    cmd->add_option("--block-size", o->block_size,
                    "Tokens per block of the paged layout, powers of two from 16 to 1024, comma-separated (a paged "
                    "row each; unused without --kv-layout paged)")
        ->capture_default_str();
    cmd->add_option("--kv-dtype", o->kv_dtype,
                    "How K and V are stored, side by side: dtype (as --dtype), fp16, bf16 (must equal --dtype), "
                    "fp8_e4m3 or fp8 (one scale per tensor; comma-separated)")
        ->capture_default_str();
    cmd->add_option("--warmup", o->n_warmup, "Untimed runs before timing")->check(at_least(0))->capture_default_str();
    cmd->add_option("--repeats", o->n_repeat, "Timed runs; the median is reported")->check(at_least(1))->capture_default_str();
    cmd->add_option("--seed", o->seed, "Seed of the correctness check's random inputs")->capture_default_str();
    add_format_option(cmd, opts->format);
    cmd->footer("Example:\n  kvlab gpu attention --model llama-3-8b --context 1k,8k --attention mha,gqa:8,mqa\n"
                "  kvlab gpu attention --model llama-3-8b --context 32k --batch 64 --attention mqa --kernel cuda-cores,tensor-cores\n"
                "  kvlab gpu attention --model llama-3-8b --batch 64 --context 32k --kv-layout contiguous,paged "
                "--block-size 16,64,128 --kv-dtype dtype,fp8");
    cmd->callback([opts] {
        const GpuAttentionRun run = run_gpu_attention(opts->request);
        print_report(std::cout, run.report, opts->format);
        if (!run.failure.empty()) throw Error(run.failure);
    });
}

}  // namespace kvlab::cli
