// Narrow weights (simulate --weight-dtype): the stored values are the codecs' (tested against
// hand-computed codes in test_kv_format.cpp), the kernels equal a double-precision product over those
// values, the bytes are hand arithmetic, and the model reads only the narrow bytes.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kvlab/calc/presets.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/kv/kv_format.hpp"
#include "kernels/matmul.hpp"
#include "kernels/narrow_weights.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/sim/simulator.hpp"
#include "kvlab/model/transformer.hpp"
#include "sim_configs.hpp"

using namespace kvlab;

namespace {

MatrixRM random_matrix(std::int64_t rows, std::int64_t cols, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    MatrixRM m(rows, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
    return m;
}

// What one stored weight reads back as, from the one-value codecs.
MatrixRM widened_by_codec(const MatrixRM& w, DType dtype) {
    MatrixRM out(w.rows(), w.cols());
    for (Eigen::Index r = 0; r < w.rows(); ++r)
        for (Eigen::Index c = 0; c < w.cols(); c += 32) {
            if (dtype == DType::q8_0) {
                const BlockQ8_0 b = quantize_q8_0(std::span<const float, 32>(w.row(r).data() + c, 32));
                dequantize_q8_0(b, std::span<float, 32>(out.row(r).data() + c, 32));
                continue;
            }
            for (Eigen::Index j = c; j < std::min<Eigen::Index>(c + 32, w.cols()); ++j)
                out(r, j) = dtype == DType::bf16 ? bf16_decode(bf16_encode(w(r, j))) : fp16_decode(fp16_encode(w(r, j)));
        }
    return out;
}

}  // namespace

TEST_CASE("Narrow weight kernels equal a double-precision product over the stored values") {
    // 150 rows: the GEMV over rows 3..146 is 8 streams of 18 rows (or 4 of 36); the GEMM's panels hold
    // 65536 / 1056 = 62 rows, so 144 rows take three panels (62, 62, 20). 1056 columns = 33 blocks of 32.
    const MatrixRM w = random_matrix(150, 1056, 3);
    const MatrixRM x = random_matrix(5, 1056, 4);  // 5 tokens
    for (const DType dtype : {DType::bf16, DType::fp16, DType::q8_0}) {
        CAPTURE(dtype_name(dtype));
        HugeArena arena(HugeArena::footprint(NarrowMatrix::bytes(dtype, 150, 1056)));
        const NarrowMatrix nm(w, dtype, "w", arena);
        CHECK(arena.used() == arena.footprint(nm.bytes()));
        const MatrixRM wide = widened_by_codec(w, dtype);
        std::vector<float> row(1056);
        for (std::int64_t r = 0; r < 150; ++r) {
            nm.decode(r, 0, 1056, row.data());
            CHECK(Eigen::Map<const VectorF>(row.data(), 1056) == wide.row(r).transpose());
        }
        CHECK(wide != w);  // rounded: the store is not a copy
        // rows 3..146 for one token (the GEMV), then for all five (the GEMM)
        std::vector<float> y(144);
        gemv_narrow(nm, 3, 144, x.row(0).data(), y.data());
        MatrixRM out(5, 144);
        MatrixRM panel(1, narrow_panel_floats(1056)), scratch(1, gemm_scratch_floats(1056, 5));
        gemm_narrow(nm, 3, 144, x.data(), x.cols(), 5, out.data(), out.cols(), panel.data(), scratch.data());
        for (std::int64_t t = 0; t < 5; ++t)
            for (std::int64_t i = 0; i < 144; ++i) {
                double ref = 0.0;
                for (std::int64_t j = 0; j < 1056; ++j) ref += static_cast<double>(wide(3 + i, j)) * x(t, j);
                // fp32 sums of 1056 products of size ~1: within 1e-4 of the exact sum
                if (t == 0) CHECK(std::fabs(y[static_cast<std::size_t>(i)] - ref) < 1e-4 * (1.0 + std::fabs(ref)) * 10);
                CHECK(std::fabs(out(t, i) - ref) < 1e-4 * (1.0 + std::fabs(ref)) * 10);
            }
    }
    HugeArena arena(4096);
    CHECK_THROWS_AS(NarrowMatrix(random_matrix(2, 48, 5), DType::q8_0, "w", arena), UsageError);  // 48 is not a multiple of 32
    CHECK(arena.used() == 0);  // refused before taking any bytes
    CHECK_THROWS_AS(check_weight_dtype(DType::q4_0), UsageError);
}

TEST_CASE("The narrow GEMV's result depends neither on its stream count nor on where its rows start") {
    // rows 3..149 (147 = 8 x 18 + 3 = 4 x 36 + 3): with 8 streams rows 147..149 are left over, with 4
    // rows 147..149 too but the streams hold other rows; split at row 70, each half leaves others over
    const MatrixRM w = random_matrix(150, 1056, 7);
    const MatrixRM x = random_matrix(1, 1056, 8);
    for (const DType dtype : {DType::bf16, DType::fp16, DType::q8_0}) {
        CAPTURE(dtype_name(dtype));
        HugeArena arena(HugeArena::footprint(NarrowMatrix::bytes(dtype, 150, 1056)));
        const NarrowMatrix nm(w, dtype, "w", arena);
        std::vector<float> y8(147), y4(147), split(147), dflt(147);
        gemv_narrow(nm, 3, 147, x.data(), y8.data(), 8);
        gemv_narrow(nm, 3, 147, x.data(), y4.data(), 4);
        gemv_narrow(nm, 3, 67, x.data(), split.data(), 8);
        gemv_narrow(nm, 70, 80, x.data(), split.data() + 67, 4);
        gemv_narrow(nm, 3, 147, x.data(), dflt.data());
        CHECK(y4 == y8);  // bit for bit
        CHECK(split == y8);
        CHECK(dflt == y8);
        CHECK(y8[146] != 0.0f);  // the last row was computed
    }
    const MatrixRM w2 = random_matrix(8, 64, 9);
    HugeArena arena(HugeArena::footprint(NarrowMatrix::bytes(DType::bf16, 8, 64)));
    const NarrowMatrix nm(w2, DType::bf16, "w", arena);
    std::vector<float> y(8);
    CHECK_THROWS_AS(gemv_narrow(nm, 0, 8, w2.data(), y.data(), 6), std::logic_error);
    // bf16 and fp16 read as many streams as the fp32 GEMV; q8_0 always 8
    CHECK(narrow_gemv_streams(DType::bf16) == gemv_streams());
    CHECK(narrow_gemv_streams(DType::fp16) == gemv_streams());
    CHECK(narrow_gemv_streams(DType::q8_0) == 8);
}

TEST_CASE("Narrow weight bytes: stories15M by hand") {
    // stories15M: d 288, 6 layers, 6 heads (MHA, D 48), FFN 768, vocab 32000, classifier tied to the embedding.
    // per layer 4 x 288 x 288 (q, k, v, o) + 3 x 288 x 768 (w1, w2, w3) = 331776 + 663552 = 995328 weights;
    // x 6 layers = 5971968, + classifier 32000 x 288 = 9216000: 15187968 weights
    const ModelConfig cfg = load_preset("stories15m");
    CHECK(narrow_weights_bytes(cfg, DType::bf16) == 15187968ull * 2);       // 30375936 B
    CHECK(narrow_weights_bytes(cfg, DType::q8_0) == 15187968ull / 32 * 34);  // blocks of 32 in 34 B: 16137216 B
    // and what narrow_weights allocates, on a shape small enough to build
    ModelConfig small = test::tiny_config(Family::llama, 4, 2);
    small.d_model = 64;
    small.d_head = 16;
    small.d_ff = 96;
    const Weights w = random_weights(small, 1);
    for (const DType dtype : {DType::bf16, DType::q8_0}) CHECK(narrow_weights(w, dtype).bytes() == narrow_weights_bytes(small, dtype));
}

TEST_CASE("A model with narrow weights reads only the narrow bytes, and its logits move by about their rounding") {
    ModelConfig cfg = test::tiny_config(Family::llama, 4, 2);
    cfg.d_model = 64;
    cfg.d_head = 16;
    cfg.d_ff = 96;
    const Weights w = random_weights(cfg, 2);
    const std::vector<TokenId> prompt{1, 7, 3, 9, 4};
    auto run = [&](const NarrowWeights* nw, StepCost& decode_cost) {
        TransformerSize size{8, 5, false, nw != nullptr};
        Transformer model(cfg, w, size, nw);
        KvCache cache(cfg, 8);
        model.forward_cached(prompt, 0, cache, nullptr);  // the prefill: a GEMM over 5 tokens
        const TokenId next = 11;
        return VectorF(model.forward_cached(std::span<const TokenId>(&next, 1), 5, cache, &decode_cost));
    };
    StepCost fp32_cost;
    const VectorF fp32 = run(nullptr, fp32_cost);
    for (const DType dtype : {DType::bf16, DType::q8_0}) {
        CAPTURE(dtype_name(dtype));
        const NarrowWeights nw = narrow_weights(w, dtype);
        StepCost cost;
        const VectorF narrow = run(&nw, cost);
        const double dlogit = (narrow - fp32).cwiseAbs().maxCoeff();
        CHECK(dlogit > 0.0);
        CHECK(dlogit < 0.05);  // random weights of sigma 0.02: logits of ~0.1, bf16 keeps 8 bits
        // matmul weights per step: 2 layers x (q 64x64 + k 32x64 + v 32x64 + o 64x64 + 3 x 96x64) = 2 x 30720
        // = 61440, + classifier 50 x 64 = 3200: 64640 weights, 4 B each in fp32
        const std::uint64_t matmul_fp32 = 64640ull * 4;
        const std::uint64_t matmul_narrow = dtype == DType::bf16 ? 64640ull * 2 : 64640ull / 32 * 34;
        CHECK(fp32_cost.total().bytes_weights_read - cost.total().bytes_weights_read == matmul_fp32 - matmul_narrow);
    }
}

TEST_CASE("--no-quality: a narrow-weight run alone decodes what it decodes beside the fp32 model, measures no quality, "
          "and needs no fp32 reference cache") {
    ModelConfig cfg = test::tiny_config(Family::llama, 4, 2);
    cfg.d_model = 64;
    cfg.d_head = 16;
    cfg.d_ff = 96;
    const Weights w = random_weights(cfg, 3);
    SimulateOptions o;
    o.mode = SimMode::cached;
    o.n_prompt = 5;
    o.n_steps = 12;
    o.weight_dtype = DType::q8_0;
    const SimulationResult with = run_simulation(cfg, w, o);
    o.quality = false;
    const SimulationResult alone = run_simulation(cfg, w, o);
    CHECK(with.kv_quality.has_value());
    CHECK_FALSE(alone.kv_quality.has_value());
    CHECK(alone.generated == with.generated);  // the fp32 model beside it never chooses a token
    // the estimate drops the fp32 reference cache: 2 (K, V) x 2 layers x 32 (Hkv*D) x 4 B = 512 B per position,
    // over 5 + 12 - 1 = 16 positions = 8192 B, and the reference model's activations (more than 0)
    o.quality = true;
    const MemoryEstimate e_with = estimate_simulation_memory(cfg, o);
    o.quality = false;
    const MemoryEstimate e_alone = estimate_simulation_memory(cfg, o);
    CHECK(e_with.kv_cache - e_alone.kv_cache > 8192);
    CHECK(e_with.weights == e_alone.weights);
    // a policy still refuses the uncached mode without its quality measure
    o.mode = SimMode::both;
    CHECK_THROWS_AS(run_simulation(cfg, w, o), UsageError);
}
