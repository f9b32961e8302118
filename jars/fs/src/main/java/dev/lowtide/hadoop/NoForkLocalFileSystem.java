package dev.lowtide.hadoop;

import java.io.IOException;

import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Hadoop's checksummed local file system (.crc files and all) over
 * {@link NoForkRawLocalFileSystem}: set {@code fs.file.impl} to this.
 *
 * <p>Without that setting, pyspark's {@code file:} resolves (through Hadoop's service
 * loader) to hive-exec's ProxyLocalFileSystem, a LocalFileSystem whose only change is a
 * rename that never replaces an existing file (FileSystem's contract; a plain
 * LocalFileSystem's rename does): kept here, so that Spark's checkpoint files are renamed
 * into place as before.
 */
public class NoForkLocalFileSystem extends LocalFileSystem {
  public NoForkLocalFileSystem() {
    super(new NoForkRawLocalFileSystem());
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    return !isFile(dst) && super.rename(src, dst);
  }
}
