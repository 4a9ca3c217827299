"""Pure maths and shape rules: the format registry, element codecs, block scaling, scale
layouts and the problem descriptions of every GEMM family. No primitive, no array type."""
