/* Stage 0: unpatched apache-airflow-core 3.3.2 (see shared.pml). */
#define STAGE 0
#include "shared.pml"
