// Placeholder so the ops library has a translation unit; removed when the
// first kernel lands.
namespace kvq {}
