package dev.lowtide.hadoop;

import java.io.IOException;
import java.nio.file.Files;

import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's raw local file system, setting permissions in-process.
 *
 * <p>Without Hadoop's native library (pyspark ships none), {@link RawLocalFileSystem}
 * sets the permissions of every file and folder it creates by starting a {@code chmod}
 * process: every checkpoint file, state changelog, Parquet file and its .crc. Every
 * create and mkdirs goes through {@link #setPermission}, so overriding it is enough.
 * The mode is set with chmod(2) through java.nio's "unix" attribute view; where that
 * view is missing (not a POSIX platform), Hadoop's own way runs.
 */
public class NoForkRawLocalFileSystem extends RawLocalFileSystem {
  private static final String UNIX_MODE = "unix:mode";
  private static final int FILE_TYPE_BITS = 0170000;
  private static final int DIRECTORY = 0040000;
  private static final int SET_ID_BITS = 06000;

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    java.nio.file.Path file = pathToFile(p).toPath();
    int mode = permission.toShort() & 07777;
    try {
      int current = (Integer) Files.getAttribute(file, UNIX_MODE);
      // chmod(1) with a four-digit octal mode keeps a folder's set-user/group-ID bits
      // (coreutils' rule for folders): keep them as the chmod process would
      if ((current & FILE_TYPE_BITS) == DIRECTORY) {
        mode |= current & SET_ID_BITS;
      }
      Files.setAttribute(file, UNIX_MODE, mode);
    } catch (UnsupportedOperationException | IllegalArgumentException e) {
      super.setPermission(p, permission);
    }
  }
}
