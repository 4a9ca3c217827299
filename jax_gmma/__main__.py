"""python -m jax_gmma [info]"""
import sys


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  cmd = argv[0] if argv else "info"
  if cmd == "info":
    from .info import info_text
    print(info_text())
    return 0
  print(f"usage: python -m jax_gmma info   (unknown command {cmd!r})", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main())
