"""On-disk episodes: LeRobotDataset v3.0 read/write (+ v2.1 read) and H.264 video I/O."""
from comsim.io.lerobot import DatasetError, DatasetWriter, LeRobotDataset, write_dataset
from comsim.io.video import concat_videos, read_video, video_info, write_video

__all__ = ["DatasetError", "DatasetWriter", "LeRobotDataset", "write_dataset",
           "write_video", "read_video", "concat_videos", "video_info"]
