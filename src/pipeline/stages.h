/* The stages of the request chain (internal to the pipeline module). */
#ifndef DREY_PIPELINE_STAGES_H
#define DREY_PIPELINE_STAGES_H

#include "drey/pipeline.h"

const drey_limits *drey_pipeline__limits(const drey_pipeline *p);

drey_stage_result drey_pipeline__validate(drey_pipeline *p, drey_request *r);

#endif
