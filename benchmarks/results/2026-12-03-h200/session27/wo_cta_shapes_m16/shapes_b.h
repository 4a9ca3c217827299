#define JAX_GMMA_WO_CTA_SHAPES {1, 2, 2, 2}, {1, 2, 2, 1}
