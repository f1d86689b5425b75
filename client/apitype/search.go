package apitype

import "time"

// Headers of reading a file by lines (GET …/files/{path}?line_offset=N&line_limit=M).
const (
	HeaderLineOffset = "X-Line-Offset" // the first line returned, 0-based
	HeaderLineCount  = "X-Line-Count"  // lines in the body
	HeaderLinesMore  = "X-Lines-More"  // ?1 when the file has lines after these
)

// FileStat is the body of GET …/stat/{path}: a path that does not exist is not an
// error, only Exists false.
type FileStat struct {
	Path    string    `json:"path"`
	Exists  bool      `json:"exists"`
	Type    string    `json:"type,omitempty"` // "file", "dir", "symlink", "other"
	Size    int64     `json:"size"`
	Mode    string    `json:"mode,omitempty"` // octal permission bits, e.g. "0644"
	UID     int       `json:"uid"`
	GID     int       `json:"gid"`
	ModTime time.Time `json:"mtime"`
	Target  string    `json:"target,omitempty"` // of a symlink, never followed
	ETag    string    `json:"etag,omitempty"`   // of a regular file: what If-Match takes
}

// FoundEntry is one entry of a find; Path is relative to the directory searched. Size,
// Mode, UID, ModTime and Target come with stat=1 (one stat per entry).
type FoundEntry struct {
	Path    string    `json:"path"`
	Type    string    `json:"type"`
	Size    int64     `json:"size,omitzero"`
	Mode    string    `json:"mode,omitempty"`
	UID     int       `json:"uid,omitzero"`
	ModTime time.Time `json:"mtime,omitzero"`
	Target  string    `json:"target,omitempty"`
	Mount   bool      `json:"mount,omitempty"` // a directory on another mount: listed, never entered
}

// FindResult is the body of GET …/find/{dir}. Truncated: the walk stopped at the
// limit ("limit") or at the time limit ("time"); pass Next as after= to go on.
type FindResult struct {
	Entries   []FoundEntry `json:"entries"`
	Truncated bool         `json:"truncated"`
	Reason    string       `json:"reason,omitempty"`
	Next      string       `json:"next,omitempty"`
}

// GrepMatch is one matching line: Line and Column (bytes, of the first match) are
// 1-based, Text is the line without its newline, cut at 1024 bytes (Cut).
type GrepMatch struct {
	Path   string   `json:"path"`
	Line   int      `json:"line"`
	Column int      `json:"column"`
	Text   string   `json:"text"`
	Cut    bool     `json:"cut,omitempty"`
	Before []string `json:"before,omitempty"`
	After  []string `json:"after,omitempty"`
}

// GrepResult is the body of GET …/grep/{path}. Truncated: a limit stopped the search
// ("matches", "bytes", "time", or "memory": the daemon's search budget was spent).
type GrepResult struct {
	Matches       []GrepMatch `json:"matches"`
	Truncated     bool        `json:"truncated"`
	Reason        string      `json:"reason,omitempty"`
	Files         int         `json:"files"`
	SkippedBinary int         `json:"skipped_binary"`
	SkippedLarge  int         `json:"skipped_large"`
}

// ReplaceRequest is the body of POST …/files/{path}?op=replace.
type ReplaceRequest struct {
	Old string `json:"old"`
	New string `json:"new"`
	All bool   `json:"all,omitempty"`
}

// ReplaceResult answers a replacement: how many were made and the new file's ETag.
type ReplaceResult struct {
	Replacements int    `json:"replacements"`
	ETag         string `json:"etag"`
}

// Watch event types (the SSE "event:" field of GET …/watch/{dir}).
const (
	WatchReady    = "ready"    // first, once the directories are watched
	WatchCreate   = "create"   //
	WatchWrite    = "write"    //
	WatchRemove   = "remove"   //
	WatchRename   = "rename"   // Path is the new name, OldPath the old one
	WatchOverflow = "overflow" // Dropped events were lost (0: the kernel's queue overflowed, count unknown)
	WatchLimit    = "limit"    // the directory at Path and others were not watched: max_dirs reached
	// WatchRefused: the directory at Path (and, until a watched one goes away, later
	// ones) appeared but was not watched: the lease's or the daemon's inotify budget is
	// spent, or the host refused. Reason says which.
	WatchRefused = "refused"
	WatchEnd     = "end" // last: the watch ended (lease released, directory removed, daemon stopping)
)

// WatchEvent is the JSON "data:" of one server-sent event of a watch.
type WatchEvent struct {
	Type    string `json:"type"`
	Path    string `json:"path,omitempty"`
	OldPath string `json:"old_path,omitempty"`
	Dir     bool   `json:"dir,omitempty"`
	Dropped int64  `json:"dropped,omitempty"`
	Reason  string `json:"reason,omitempty"` // of "end" and "refused"
}
