// `kvlab presets`: the model presets (shapes, attention, computed parameter count) and, with --gpus,
// the GPU presets (memory, bandwidth, dense FP16 FLOP/s), each row with its public source.
#pragma once
#include "kvlab/core/printer.hpp"

namespace kvlab {

// `with_sources`: add the (long) source column; the aligned table leaves it out, csv/json/markdown keep it.
Report model_presets_report(bool with_sources);
Report gpu_presets_report(bool with_sources);

}  // namespace kvlab
