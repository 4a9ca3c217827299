"""python -m jax_gmma [info]"""
import sys

from .info import info_text


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  cmd = argv[0] if argv else "info"
  if cmd == "info":
    print(info_text())
    return 0
  print(f"usage: python -m jax_gmma info   (unknown command {cmd!r})", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main())
