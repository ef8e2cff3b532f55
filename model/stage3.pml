/* Stage 3: 3.3.2 + patches 1-3, drain-before-put (see shared.pml). */
#define STAGE 3
#include "shared.pml"
