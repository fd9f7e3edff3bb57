"""Video metrics entry point: `python eval/eval_video.py --pred DIR --ref DIR [...]`.

The same as `comsim eval video`; see `comsim/metrics/evaluate.py` for inputs and protocols.
"""
import sys

from comsim.cli import main

if __name__ == "__main__":
    sys.exit(main(["eval", "video", *sys.argv[1:]]))
