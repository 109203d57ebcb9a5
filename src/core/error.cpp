// Anchors the error hierarchy's vtables in one translation unit.
#include "core/error.hpp"
