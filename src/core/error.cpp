// Anchors the error hierarchy's vtables in one translation unit.
#include "kvlab/core/error.hpp"
