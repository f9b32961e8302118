package dev.lowtide.hadoop;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * Hadoop's checksummed local file system (Spark's {@code file:} default, .crc files
 * and all) over {@link NoForkRawLocalFileSystem}: set {@code fs.file.impl} to this.
 */
public class NoForkLocalFileSystem extends LocalFileSystem {
  public NoForkLocalFileSystem() {
    super(new NoForkRawLocalFileSystem());
  }
}
